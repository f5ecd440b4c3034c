fn main() -> std::process::ExitCode {
    raypipe::cli::main()
}
