fn main() {
    rsandbox::shim::panic_hook::install();
    rsandbox::cli::main()
}
