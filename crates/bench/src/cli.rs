//! Command-line interface.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::latency::LatencyArgs;
use crate::parse::{parse_bytes, parse_duration, parse_size};
use crate::pipebench::{TopologyKind, TransferKind};
use crate::transport::Transport;
use crate::worker::WorkerArgs;

/// Default array sizes of `transport`, in f32 elements.
pub const DEFAULT_SIZES: [usize; 5] = [16, 1_000, 100_000, 1_000_000, 10_000_000];

/// Measures how fast f32 arrays move between processes: shm-ring against memcpy, pipes, Unix
/// sockets, an in-process channel and iceoryx2, and the pipeline crate's workloads.
#[derive(Debug, Parser)]
#[command(name = "shmpipe-bench", version, about, long_about = None)]
pub struct Cli {
    /// What to measure.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Headline demo: 1M-float arrays, copy vs zero-copy vs adaptive against memcpy (< 1 min).
    Demo(DemoArgs),
    /// Sizes x transports, producer and consumer in two processes pinned to two cores.
    Transport(TransportArgs),
    /// The pipeline crate's workloads x workers x topology x batch bytes x transfer mode.
    Pipeline(PipelineArgs),
    /// Two-process ping-pong of one 16-float message: round-trip percentiles per peer
    /// (raw cache line and futex words, shm-ring, iceoryx2), the idle CPU of a blocked receiver.
    Latency(LatencyArgs),
    /// Shared memory committed, summed PSS and start() time of pipelines per worker count.
    Memory(MemoryArgs),
    /// Redraws a plot from a CSV file written by `transport`, `demo` or `pipeline`.
    Plot(PlotArgs),
    /// Internal: one side of a measurement (run by the harness itself).
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// Internal: one side of a latency measurement (run by the harness itself).
    #[command(hide = true)]
    LatencyWorker(crate::latency::WorkerArgs),
}

/// Options shared by every measuring subcommand.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Interleaved rounds; results are the median over rounds with min..max spread.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Measured time per (transport, size) and round, e.g. `0.3`, `300ms`, `1s`.
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub duration: Duration,
    /// Write one row per (transport or config, size) to this CSV file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Plot throughput against size (log scales, one line per transport) to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Do not draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// `transport` options.
#[derive(Debug, Clone, Args)]
pub struct TransportArgs {
    /// Array sizes in f32 elements, comma-separated; `_` separators and `k`/`M` suffixes are
    /// accepted (`16,1k,100k,1M,10M`).
    #[arg(long, value_delimiter = ',', value_parser = parse_size,
          default_values_t = DEFAULT_SIZES.to_vec())]
    pub sizes: Vec<usize>,
    /// Transports to measure, comma-separated (default: every one this binary was built with).
    /// memcpy is always measured: every ratio is taken against it.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub transports: Vec<Transport>,
    /// Round and output options.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `demo` options (defaults embedded so that `demo` alone runs the headline).
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Array size in f32 elements.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub elements: usize,
    /// Round and output options.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Workload of the `pipeline` subcommand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// f32 arrays through a check and a scale step, over the configuration grid.
    Arrays,
    /// The GluonTS-style training loader (shmpipe-timeseries): in one process and with each
    /// `--workers` count, from JSON lines and from memory.
    Timeseries,
}

/// `pipeline` options: the grid is sizes x workers x topology x batch bytes x transfer.
#[derive(Debug, Clone, Args)]
pub struct PipelineArgs {
    /// Workload to run.
    #[arg(long, value_enum, default_value = "arrays")]
    pub workload: Workload,
    /// Series in the generated dataset (`timeseries` workload; 4000 are ~36 MB of JSON).
    #[arg(long, default_value_t = 4000)]
    pub series: usize,
    /// Passes over the dataset per measurement (`timeseries` workload).
    #[arg(long, default_value_t = 2)]
    pub epochs: usize,
    /// Array sizes in f32 elements per item.
    #[arg(long, value_delimiter = ',', value_parser = parse_size,
          default_values_t = vec![1_000usize, 100_000, 1_000_000])]
    pub sizes: Vec<usize>,
    /// Worker processes per stage.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 2])]
    pub workers: Vec<usize>,
    /// Step layouts.
    #[arg(long, value_delimiter = ',', value_enum, default_values = ["fused", "staged"])]
    pub topology: Vec<TopologyKind>,
    /// Target batch sizes in bytes (`k`/`M` are KiB/MiB here).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, default_values = ["64k"])]
    pub batch_bytes: Vec<usize>,
    /// Transfer modes (`socket`: the pipeline's Unix-socket reference transport).
    #[arg(long, value_delimiter = ',', value_enum,
          default_values = ["copy", "zero-copy", "adaptive", "socket"])]
    pub transfer: Vec<TransferKind>,
    /// Round and output options.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `memory` options.
#[derive(Debug, Clone, Args)]
pub struct MemoryArgs {
    /// Worker counts of the 16-float pipelines.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 2, 4, 8])]
    pub workers: Vec<usize>,
    /// Step layouts.
    #[arg(long, value_delimiter = ',', value_enum, default_values = ["fused", "staged"])]
    pub topology: Vec<TopologyKind>,
    /// f32 elements per small item.
    #[arg(long, default_value = "16", value_parser = parse_size)]
    pub small: usize,
    /// f32 elements per large item.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub large: usize,
    /// Worker counts of the large-item pipelines (empty: none).
    #[arg(long, value_delimiter = ',', default_values_t = vec![2usize])]
    pub large_workers: Vec<usize>,
    /// Small items read through each pipeline before the reading while running.
    #[arg(long, default_value_t = 2_000)]
    pub items: usize,
    /// Large items read through each pipeline before the reading while running.
    #[arg(long, default_value_t = 40)]
    pub large_items: usize,
}

/// `plot` options.
#[derive(Debug, Clone, Args)]
pub struct PlotArgs {
    /// CSV file to read.
    #[arg(long, value_name = "FILE")]
    pub csv: PathBuf,
    /// SVG file to write.
    #[arg(long, value_name = "FILE.svg")]
    pub out: PathBuf,
    /// Title on top of the plot.
    #[arg(long, default_value = "shmpipe-bench")]
    pub title: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::Role;

    #[test]
    fn transport_defaults() {
        let cli = Cli::try_parse_from(["shmpipe-bench", "transport"]).unwrap();
        let Command::Transport(a) = cli.command else {
            panic!("not transport: {cli:?}")
        };
        assert_eq!(a.sizes, DEFAULT_SIZES.to_vec());
        assert!(a.transports.is_empty());
        assert_eq!(a.run.rounds, 5);
        assert_eq!(a.run.duration, Duration::from_millis(300));
        assert_eq!((a.run.csv, a.run.plot), (None, None));
    }

    #[test]
    fn transport_options() {
        let cli = Cli::try_parse_from([
            "shmpipe-bench",
            "transport",
            "--sizes",
            "16,1k",
            "--transports",
            "pipe,shm-zero-copy",
            "--rounds",
            "2",
            "--duration",
            "50ms",
            "--csv",
            "out.csv",
            "--plot",
            "out.svg",
        ])
        .unwrap();
        let Command::Transport(a) = cli.command else {
            panic!("not transport")
        };
        assert_eq!(a.sizes, vec![16, 1000]);
        assert_eq!(a.transports, vec![Transport::Pipe, Transport::ShmZeroCopy]);
        assert_eq!(a.run.rounds, 2);
        assert_eq!(a.run.duration, Duration::from_millis(50));
        assert_eq!(a.run.csv, Some(PathBuf::from("out.csv")));
        assert_eq!(a.run.plot, Some(PathBuf::from("out.svg")));
    }

    #[test]
    fn bad_arguments_are_rejected() {
        for args in [
            &[
                "shmpipe-bench",
                "transport",
                "--transports",
                "carrier-pigeon",
            ][..],
            &["shmpipe-bench", "transport", "--rounds", "0"],
            &["shmpipe-bench", "transport", "--sizes", "0"],
            &["shmpipe-bench", "demo", "--duration", "soon"],
            &["shmpipe-bench"],
        ] {
            assert!(Cli::try_parse_from(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn pipeline_grid_options() {
        let cli = Cli::try_parse_from(["shmpipe-bench", "pipeline"]).unwrap();
        let Command::Pipeline(a) = cli.command else {
            panic!("not pipeline")
        };
        assert_eq!(a.sizes, vec![1_000, 100_000, 1_000_000]);
        assert_eq!(a.workers, vec![1, 2]);
        assert_eq!(a.topology, vec![TopologyKind::Fused, TopologyKind::Staged]);
        assert_eq!(a.batch_bytes, vec![64 << 10]);
        assert_eq!(a.transfer.len(), 4);
        let cli = Cli::try_parse_from([
            "shmpipe-bench",
            "pipeline",
            "--workers",
            "2",
            "--topology",
            "staged",
            "--batch-bytes",
            "1M,4096",
            "--transfer",
            "zero-copy",
        ])
        .unwrap();
        let Command::Pipeline(a) = cli.command else {
            panic!("not pipeline")
        };
        assert_eq!(a.batch_bytes, vec![1 << 20, 4096]);
        assert_eq!(a.transfer, vec![TransferKind::ZeroCopy]);
        assert!(parse_bytes("0").is_err() && parse_bytes("x").is_err());
    }

    #[test]
    fn latency_and_memory_defaults() {
        let cli = Cli::try_parse_from(["shmpipe-bench", "latency"]).unwrap();
        let Command::Latency(a) = cli.command else {
            panic!("not latency")
        };
        assert_eq!((a.trips, a.rounds, a.warmup), (20_000, 5, 1_000));
        assert_eq!(a.idle, Duration::from_secs(2));
        assert!(a.peers.is_empty());
        let cli = Cli::try_parse_from([
            "shmpipe-bench",
            "latency",
            "--idle",
            "0",
            "--peers",
            "cache-line,shm-typed-spin",
        ])
        .unwrap();
        let Command::Latency(a) = cli.command else {
            panic!("not latency")
        };
        assert_eq!(a.idle, Duration::ZERO);
        assert_eq!(
            a.peers,
            vec![
                crate::latency::Peer::CacheLine,
                crate::latency::Peer::ShmTypedSpin
            ]
        );
        assert!(Cli::try_parse_from(["shmpipe-bench", "latency", "--trips", "0"]).is_err());
        let cli = Cli::try_parse_from(["shmpipe-bench", "memory"]).unwrap();
        let Command::Memory(m) = cli.command else {
            panic!("not memory")
        };
        assert_eq!(m.workers, vec![1, 2, 4, 8]);
        assert_eq!(
            (m.small, m.large, m.large_workers.clone()),
            (16, 1_000_000, vec![2])
        );
    }

    #[test]
    fn demo_defaults_are_embedded() {
        let cli = Cli::try_parse_from(["shmpipe-bench", "demo"]).unwrap();
        let Command::Demo(a) = cli.command else {
            panic!("not demo")
        };
        assert_eq!(a.elements, 1_000_000);
    }

    #[test]
    fn worker_is_hidden_but_parses() {
        use clap::CommandFactory;
        let help = Cli::command().render_help().to_string();
        assert!(!help.contains("\n  worker"), "{help}");
        assert!(help.contains("\n  transport"), "{help}");
        let cli = Cli::try_parse_from([
            "shmpipe-bench",
            "worker",
            "--role",
            "consumer",
            "--transport",
            "unix-socket",
            "--elements",
            "16",
            "--duration-ms",
            "10",
            "--warmup-ms",
            "1",
            "--name",
            "x",
            "--core",
            "1",
            "--peer-core",
            "0",
        ])
        .unwrap();
        let Command::Worker(w) = cli.command else {
            panic!("not worker")
        };
        assert_eq!(
            (w.role, w.transport),
            (Role::Consumer, Transport::UnixSocket)
        );
    }
}
