//! Routing across backends by SLA class. `decide` and `breaker` are pure: statistics, time and
//! random draws come in as arguments, so every decision can be replayed in a unit test.
//! `router` holds the run-time state around them; `prom` reads statistics back from Prometheus;
//! `server` reads what each upstream server reports about itself.

pub mod breaker;
pub mod decide;
pub mod prom;
pub mod router;
pub mod server;

pub use breaker::Breaker;
pub use decide::{Candidate, Class, Decision, Draw, Objective, Policy, Reason, Stats, decide};
pub use router::{BackendState, Choice, Dispatch, Router, SloHeaders};
