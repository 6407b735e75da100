//! The `fleetgate` binary: CLI and server bootstrap only.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fleetgate::config::Config;

// Many small allocations per request: glibc malloc spent ~20 % of the gateway's CPU on them.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Exit code for a bad configuration (EX_CONFIG-like usage error, before any port is bound).
const EXIT_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "fleetgate",
    version,
    about = "LLM fleet gateway: one URL in front of many inference nodes"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Config file for `run` when no subcommand is given.
    #[arg(long, global = true, default_value = "conf/fleetgate.yaml")]
    config: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (default).
    Run {
        /// Zero-downtime upgrade: take the listening sockets from the running gateway (over
        /// server.upgrade_sock); then send the old one SIGQUIT.
        #[arg(long, short = 'u')]
        upgrade: bool,
    },
    /// Validate config files; exit 64 with every problem named.
    Check { files: Vec<PathBuf> },
    /// Run the simulated nodes a config file describes (`backend: sim` nodes with a `sim:` block).
    Sim,
    /// Heartbeat this node's host facts to a gateway (run beside the node's backend).
    Agent(fleetgate::agent::AgentArgs),
    /// Probe node URLs (Ollama, vLLM, SGLang, llama.cpp, LM Studio, OpenAI-compatible) and write
    /// a commented config for them.
    Init {
        /// Node base URLs, e.g. http://10.0.0.7:11434
        #[arg(required = true)]
        urls: Vec<String>,
        /// Write the config here instead of standard output.
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Overwrite --output if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Print the bearer token of one node's agent (derived from the config's fleet.agent_token;
    /// good for that node id only).
    AgentToken { node_id: String },
    /// Show how a request would be routed on the fleet a config describes (static facts).
    Explain {
        /// JSON request body (OpenAI, Ollama or Anthropic).
        #[arg(long)]
        request: PathBuf,
        /// API path the body is for; default /v1/chat/completions (/api/generate for `prompt`).
        #[arg(long)]
        path: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn load(path: &Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(|e| {
        eprintln!("{}: invalid configuration:", path.display());
        for line in &e.0 {
            eprintln!("  - {line}");
        }
        ExitCode::from(EXIT_CONFIG)
    })
}

fn main() -> ExitCode {
    fleetgate::logging::init();
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run { upgrade: false }) {
        Command::Run { upgrade } => run(&cli.config, upgrade),
        Command::Check { files } => check(&files),
        Command::Sim => sim(&cli.config),
        Command::Agent(args) => agent(&cli.config, &args),
        Command::Init {
            urls,
            output,
            force,
        } => init(&urls, output.as_deref(), force),
        Command::AgentToken { node_id } => agent_token(&cli.config, &node_id),
        Command::Explain {
            request,
            path,
            json,
        } => explain(&cli.config, &request, path.as_deref(), json),
    }
}

fn run(path: &Path, upgrade: bool) -> ExitCode {
    let config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match fleetgate::clients::raise_nofile_limit() {
        Ok((before, after)) if after > before => {
            log::info!("open-files limit raised from {before} to {after}")
        }
        Ok((before, _)) => log::info!("open-files limit {before} (already at the hard limit)"),
        Err(e) => log::warn!("open-files limit: cannot raise: {e}"),
    }
    let (listen, nodes) = (config.listen, config.nodes.len());
    match fleetgate::server::prepare_with(config, upgrade) {
        Ok(p) => {
            p.fleet.set_config_path(path.to_path_buf());
            log::info!(
                "fleetgate listening on {listen}, admin on {}, {nodes} nodes",
                p.admin_addr
            );
            let mut server = p.server;
            server.add_service(pingora::services::background::background_service(
                "drain on shutdown",
                fleetgate::services::shutdown::Drain::new(p.fleet.clone(), true),
            ));
            server.run_forever()
        }
        Err(e) => {
            eprintln!("fleetgate: cannot start: {e}");
            ExitCode::FAILURE
        }
    }
}

fn agent_token(path: &Path, node_id: &str) -> ExitCode {
    let config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match config.agent_token {
        Some(secret) => {
            println!("{}", fleetgate::admin::auth::node_token(&secret, node_id));
            ExitCode::SUCCESS
        }
        None => {
            eprintln!("{}: fleet.agent_token is not set", path.display());
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

fn check(files: &[PathBuf]) -> ExitCode {
    if files.is_empty() {
        eprintln!("usage: fleetgate check FILE...");
        return ExitCode::from(EXIT_CONFIG);
    }
    let mut bad = false;
    for f in files {
        match load(f) {
            Ok(c) => println!("ok: {} ({} nodes)", f.display(), c.nodes.len()),
            Err(_) => bad = true,
        }
    }
    if bad {
        ExitCode::from(EXIT_CONFIG)
    } else {
        ExitCode::SUCCESS
    }
}

fn sim(path: &Path) -> ExitCode {
    let config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let specs: Vec<_> = config
        .nodes
        .into_iter()
        .filter_map(|n| n.sim.map(|s| (n.id, n.addr, s)))
        .collect();
    if specs.is_empty() {
        eprintln!("{}: no node has a sim: block", path.display());
        return ExitCode::from(EXIT_CONFIG);
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fleetgate sim: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fleetgate::sim::run_cli(specs)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleetgate sim: {e}");
            ExitCode::FAILURE
        }
    }
}

fn agent(config: &Path, args: &fleetgate::agent::AgentArgs) -> ExitCode {
    let settings = match fleetgate::agent::settings(config, args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fleetgate agent: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fleetgate agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fleetgate::agent::Agent::new(settings).run(args.once)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleetgate agent: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init(urls: &[String], output: Option<&Path>, force: bool) -> ExitCode {
    ExitCode::from(fleetgate::init::cli(urls, output, force))
}

fn explain(config: &Path, request: &Path, path: Option<&str>, json: bool) -> ExitCode {
    let config = match load(config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let body = match std::fs::read(request) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{}: {e}", request.display());
            return ExitCode::FAILURE;
        }
    };
    match fleetgate::admin::explain::explain_offline(config, path, &body, json) {
        // Exit 1 when no node could take the request (the report says why).
        Ok(out) => {
            print!("{}", out.text);
            if out.routed {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("fleetgate explain: {e}");
            ExitCode::FAILURE
        }
    }
}
