//! The `vigil` binary.

fn main() -> std::process::ExitCode {
    vigil::cli::main()
}
