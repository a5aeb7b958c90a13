//! `shmpipe-bench`: see `docs/bench.md`.

use std::process::ExitCode;

use clap::Parser;
use shmpipe_bench::cli::{Cli, Command};
use shmpipe_bench::{app, worker};

fn main() -> ExitCode {
    // Pipeline worker and emitter processes are this binary re-executed: there `init` runs the
    // role and exits. In every other process it returns at once.
    shmpipe::init(&shmpipe_bench::pipebench::registry());
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Worker(a) => worker::run(a),
        Command::Transport(a) => app::transport(a),
        Command::Demo(a) => app::demo(a),
        Command::Pipeline(a) => app::pipeline(a),
        Command::Latency(a) => shmpipe_bench::latency::harness::latency(a),
        Command::LatencyWorker(a) => shmpipe_bench::latency::run_worker(a),
        Command::Memory(a) => shmpipe_bench::memory::report(a),
        Command::Plot(a) => app::plot(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shmpipe-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
