fn main() {
    rsandbox::panic_hook::install();
    rsandbox::cli::main()
}
