//! Compile-fail tests: the state and lifetime rules of rdma-cm are enforced by the compiler.

#[test]
fn state_and_lifetime_rules() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
