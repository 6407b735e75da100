//! fleetgate: a Pingora gateway that routes LLM requests across a heterogeneous fleet.
#![forbid(unsafe_code)]

pub mod admin;
pub mod agent;
pub mod clients;
pub mod config;
pub mod fleet;
pub mod init;
pub mod logging;
pub mod metrics;
pub mod protocol;
pub mod proxy;
pub mod queue;
pub mod routing;
pub mod server;
pub mod services;
pub mod sim;
pub mod tenant;
