//! The open-files limit: raised to the hard limit at start where allowed, and the number of
//! client connections it leaves room for.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Descriptors kept back for the admin listener, node connections of health polls, the
/// access log and the state files, whatever the clients do.
const RESERVED_FDS: u64 = 64;

/// Raise the soft open-files limit to the hard one; returns (before, after) soft limits.
pub fn raise_nofile_limit() -> std::io::Result<(u64, u64)> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(std::io::Error::from)?;
    if soft >= hard {
        return Ok((soft, soft));
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(std::io::Error::from)?;
    Ok((soft, hard))
}

/// Client connections the current soft limit leaves room for: each proxied request holds a
/// client and a node connection, after `RESERVED_FDS`.
pub fn connection_ceiling() -> usize {
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => usize::try_from(soft.saturating_sub(RESERVED_FDS) / 2)
            .unwrap_or(usize::MAX)
            .max(1),
        Err(_) => usize::MAX,
    }
}
