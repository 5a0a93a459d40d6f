fn main() {
    rsandbox::cli::main()
}
