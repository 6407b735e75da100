//! Pure routing decisions: Stage 1 elimination and Stage 2 scoring. No I/O, no clocks.
//!
//! | file | holds |
//! |---|---|
//! | `types.rs` | inputs (`RouteRequest`, `FleetView`, `Loads`) and the `Decision` |
//! | `policy.rs` | every weight and threshold, spec defaults, the YAML `routing:` block |
//! | `eliminate.rs` | Stage 1 reason codes |
//! | `signals.rs` | Stage 2: the 8 signals of spec 000, tier weight, load tie-breaker |
//! | `affinity.rs` | conversation key (HMAC) and rendezvous hashing |
//! | `completion.rs` | completion mode: predicted wait + load + prefill + decode per pair |
//! | `evict.rs` | completion mode: which idle models a cold load unloads to make room |
//! | `decide.rs` | the pass over (node, model) pairs, provisional cap, fallback chain |
//! | `servable.rs` | what no node could ever serve (refused at once) |
//! | `resolve.rs` | `models.resolve`: coding-agent model ids by tier to a fleet model |

mod affinity;
mod completion;
mod decide;
mod eliminate;
mod evict;
mod policy;
mod resolve;
mod servable;
mod signals;
mod types;

#[cfg(test)]
mod completion_tests;
#[cfg(test)]
mod decide_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;

pub use self::affinity::{conversation_key, prefix_key, rendezvous_weight};
pub use self::completion::{priors, Prediction};
pub use self::decide::decide;
pub use self::evict::{crowded, fits_free, victims, worth_restoring};
pub use self::policy::{Policy, PolicyError};
pub use self::resolve::{embedding_name, glob, rank_size, ModelTier, Resolve, TierRule};
pub use self::servable::unservable_tags;
pub use self::types::*;
