//! The test agent as a small binary of its own, for the process backend in benchmarks: the bench
//! binary itself is large, and re-executing it per attempt bills the dynamic loader's work on
//! it to the pipeline being measured.

fn main() {
    turnpike_test_agent::run()
}
