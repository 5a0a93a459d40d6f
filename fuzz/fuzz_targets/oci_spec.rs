#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rsandbox::fuzzing::oci_spec(data));
