fn main() -> std::process::ExitCode {
    hallmark::main()
}
