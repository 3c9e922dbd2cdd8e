//! The test agent as its own small binary (packaged `FROM scratch` as the agent image).
fn main() {
    turnpike_test_agent::run()
}
