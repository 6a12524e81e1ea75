//! The `toolgate` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The tool gateway beside agent sandboxes.
#[derive(Parser)]
#[command(name = "toolgate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration file as a whole; every problem is printed
    /// with its field path.
    CheckConfig {
        /// The TOML file.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let environment = std::env::vars().collect();
    match cli.command {
        Command::CheckConfig { file } => match toolgate::app::check_config(&file, &environment) {
            Ok(summary) => {
                println!(
                    "{}: ok (store: {}, stdio servers: {}, egress entries: {})",
                    file.display(),
                    summary.store_backend,
                    summary.stdio_servers,
                    summary.egress_entries
                );
                ExitCode::SUCCESS
            }
            Err(errors) => {
                for error in &errors.0 {
                    eprintln!("{}: {error}", file.display());
                }
                ExitCode::FAILURE
            }
        },
    }
}
