//! Links libibverbs and librdmacm, found with pkg-config. Generates nothing: the bindings are
//! checked in (`scripts/gen-bindings`), so no libclang and no C headers are needed to build.

fn main() {
    println!("cargo:rerun-if-env-changed=DOCS_RS");
    // docs.rs builds documentation only, on machines without rdma-core: nothing to link.
    if std::env::var_os("DOCS_RS").is_some() {
        return;
    }
    for (lib, version) in [("libibverbs", "1.8.28"), ("librdmacm", "1.2.28")] {
        if let Err(e) = pkg_config::Config::new().atleast_version(version).probe(lib) {
            panic!(
                "\n\nrdma-verbs-sys: {lib} {version} or newer was not found by pkg-config ({e}).\n\
                 Install rdma-core's development files:\n  \
                 Debian, Ubuntu: apt install libibverbs-dev librdmacm-dev pkg-config\n  \
                 Fedora, RHEL:   dnf install rdma-core-devel pkgconf-pkg-config\n  \
                 Arch:           pacman -S rdma-core pkgconf\n\
                 (PKG_CONFIG_PATH finds an rdma-core installed elsewhere.)\n"
            );
        }
    }
}
