//! Routing across backends by SLA class (issue 6, in progress): the pure decision function and
//! the circuit breaker. Nothing here does I/O or reads a clock: statistics, time and random
//! draws come in as arguments, so every decision can be replayed in a unit test.

pub mod breaker;
pub mod decide;

pub use breaker::Breaker;
pub use decide::{Candidate, Class, Decision, Draw, Objective, Policy, Reason, Stats, decide};
