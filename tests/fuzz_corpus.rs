//! The fuzz targets on stable Rust, in CI: every committed seed (`fuzz/corpus/<target>/*`),
//! then a few thousand mutations of each seed from a fixed-seed generator. The property is
//! the fuzzers': no decoder panics on any input. The libFuzzer runs themselves are
//! `hack/fuzz.sh` (nightly, cargo-fuzz).

use std::path::{Path, PathBuf};

use rsandbox::fuzzing::TARGETS;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no seeds in {}", dir.display());
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

/// xorshift64*: a fixed sequence, so a failure reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One mutation: flip, insert, delete, duplicate a slice, or splice in an interesting value.
fn mutate(rng: &mut Rng, data: &mut Vec<u8>) {
    const INTERESTING: &[&[u8]] = &[
        b"\xff\xff\xff\xff",
        b"\x00",
        b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
        "ä€😀".as_bytes(),
        b"null",
        b"[]",
        b"{}",
        b"..",
        b"/",
        b"\"",
    ];
    match rng.below(5) {
        0 if !data.is_empty() => {
            let i = rng.below(data.len());
            data[i] ^= 1 << rng.below(8);
        }
        1 => {
            let i = rng.below(data.len() + 1);
            data.insert(i, rng.next() as u8);
        }
        2 if !data.is_empty() => {
            let i = rng.below(data.len());
            let n = rng.below(data.len() - i) + 1;
            data.drain(i..i + n.min(16));
        }
        3 if !data.is_empty() => {
            let i = rng.below(data.len());
            let n = (rng.below(data.len() - i) + 1).min(64);
            let chunk = data[i..i + n].to_vec();
            let at = rng.below(data.len() + 1);
            data.splice(at..at, chunk);
        }
        _ => {
            let v = INTERESTING[rng.below(INTERESTING.len())];
            let at = rng.below(data.len() + 1);
            data.splice(at..at, v.iter().copied());
        }
    }
}

#[test]
fn every_seed_and_its_mutations_decode_without_panicking() {
    for (name, target) in TARGETS {
        let seeds = corpus(name);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ name.len() as u64);
        for seed in &seeds {
            target(seed);
            for _ in 0..2000 {
                let mut data = seed.clone();
                for _ in 0..=rng.below(4) {
                    mutate(&mut rng, &mut data);
                }
                target(&data);
            }
        }
        // Nothing, and noise.
        target(&[]);
        let noise: Vec<u8> = (0..4096).map(|_| rng.next() as u8).collect();
        target(&noise);
    }
}
