//! The test agent, built as a binary of the tests package (see Cargo.toml).
fn main() {
    turnpike_test_agent::run()
}
