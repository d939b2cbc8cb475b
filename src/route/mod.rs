//! Routing across backends by SLA class. `decide` and `breaker` are pure: statistics, time and
//! random draws come in as arguments, so every decision can be replayed in a unit test.
//! `router` holds the run-time state around them; `prom` reads statistics back from Prometheus;
//! `server` reads what each upstream server reports about itself; `pool` chooses a replica
//! within a backend (pure, like `decide`), whose endpoints are listed or found by `discovery`.

// On the request path: no function over clippy.toml's line threshold.
#![warn(clippy::too_many_lines)]

pub mod breaker;
pub mod decide;
pub mod discovery;
pub mod pool;
pub mod prom;
pub mod router;
pub mod server;

pub use breaker::Breaker;
pub use decide::{Candidate, Class, Decision, Draw, Objective, Policy, Reason, Stats, decide};
pub use pool::PickReason;
pub use router::{Ask, BackendState, Choice, Dispatch, Endpoint, EndpointWindows, Router, SloHeaders};
