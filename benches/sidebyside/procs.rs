//! The proxies under test as child processes (Debian's nginx, the release fleetgate binary),
//! with their CPU time and memory read from /proc.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A proxy process tree: the main pid and its workers (nginx), killed when dropped.
pub struct Proxy {
    pub name: String,
    pub port: u16,
    child: Child,
    pids: Vec<u32>,
    pub log: PathBuf,
}

/// utime + stime of `pid` in clock ticks (all threads).
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the ")" of the command name: state is field 3, utime 14, stime 15.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    n(14) + n(15)
}

/// A /proc/<pid>/status field in kB (VmRSS, VmHWM).
pub fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

fn wait_listening(port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

impl Proxy {
    /// CPU seconds used so far by the whole process tree.
    pub fn cpu_secs(&self) -> f64 {
        let ticks: u64 = self.pids.iter().map(|p| cpu_ticks(*p)).sum();
        ticks as f64 / 100.0
    }

    /// Peak and current RSS in MB, summed over the tree.
    pub fn rss_mb(&self) -> (f64, f64) {
        let sum = |f: &str| self.pids.iter().map(|p| status_kb(*p, f)).sum::<u64>() as f64 / 1024.0;
        (sum("VmHWM:"), sum("VmRSS:"))
    }

    /// Lines of its log that contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .map(|s| s.lines().filter(|l| l.contains(needle)).count())
            .unwrap_or(0)
    }

    /// Lines of `target` the gateway's log rate limit left out (it says how many, per window).
    pub fn log_dropped(&self, target: &str) -> u64 {
        let marker = format!(" more lines like these from {target} ");
        std::fs::read_to_string(&self.log)
            .map(|s| {
                s.lines()
                    .filter_map(|l| {
                        let at = l.find(&marker)?;
                        l[..at].rsplit(' ').next()?.parse::<u64>().ok()
                    })
                    .sum()
            })
            .unwrap_or(0)
    }

    /// nginx with `workers` worker processes, keep-alive upstream, no buffering of responses.
    pub fn nginx(dir: &Path, port: u16, node_port: u16, workers: usize) -> Proxy {
        let conf = dir.join("nginx.conf");
        let d = dir.display();
        std::fs::write(
            &conf,
            format!(
                "daemon off;\nmaster_process on;\nworker_processes {workers};\npid {d}/nginx.pid;\n\
                 error_log {d}/nginx-error.log warn;\nworker_rlimit_nofile 100000;\n\
                 events {{ worker_connections 30000; }}\n\
                 http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
                 fastcgi_temp_path {d}/fcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
                 upstream node {{ server 127.0.0.1:{node_port}; keepalive 512; }}\n\
                 server {{\n    listen 127.0.0.1:{port} backlog=4096;\n    client_max_body_size 64m;\n\
                 client_body_buffer_size 128k;\n    location / {{\n      proxy_pass http://node;\n\
                 proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n\
                 proxy_buffering off;\n    }}\n  }}\n}}\n"
            ),
        )
        .expect("write nginx.conf");
        let log = dir.join("nginx-error.log");
        let child = Command::new("/usr/sbin/nginx")
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(dir)
            .stdin(Stdio::null())
            .spawn()
            .expect("start nginx");
        assert!(wait_listening(port), "nginx did not listen on {port}");
        let main = child.id();
        let mut pids = vec![main];
        pids.extend(children_of(main));
        Proxy {
            name: "nginx".into(),
            port,
            child,
            pids,
            log,
        }
    }

    /// A fleetgate binary (default: this build's) with `yaml` as its whole config, log on
    /// stderr to a file.
    pub fn fleetgate(dir: &Path, port: u16, yaml: &str, tag: &str, bin: Option<&Path>) -> Proxy {
        let conf = dir.join(format!("fleetgate-{tag}.yaml"));
        std::fs::write(&conf, yaml).expect("write fleetgate config");
        let log = dir.join(format!("fleetgate-{tag}.log"));
        let bin = bin.unwrap_or(Path::new(env!("CARGO_BIN_EXE_fleetgate")));
        // FLEETGATE_BENCH_WRAP: a command the gateway runs under (a profiler, a heap
        // tracer), given the binary and its arguments.
        let wrap = std::env::var("FLEETGATE_BENCH_WRAP").unwrap_or_default();
        let mut words = wrap.split_whitespace();
        let mut cmd = match words.next() {
            Some(w) => {
                let mut c = Command::new(w);
                c.args(words).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = cmd
            .arg("run")
            .arg("--config")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start fleetgate");
        assert!(wait_listening(port), "fleetgate did not listen on {port}");
        let pids = vec![child.id()];
        Proxy {
            name: format!("fleetgate-{tag}"),
            port,
            child,
            pids,
            log,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // nginx's workers outlive a killed master: ask the master to stop them.
        // fleetgate: SIGINT is Pingora's fast shutdown.
        let sig = if self.name == "nginx" {
            "-TERM"
        } else {
            "-INT"
        };
        let _ = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
