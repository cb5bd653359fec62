//! The lifetime and state rules, proven by programs that must not compile (trybuild).
//!
//! Runs on the host (it needs no device). After an intended change to a message, regenerate the
//! expected output with `TRYBUILD=overwrite cargo test -p rdma-verbs --test compile_fail`.

#[test]
fn rules_the_compiler_enforces() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
