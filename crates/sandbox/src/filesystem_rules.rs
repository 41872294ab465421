//! The Landlock ruleset of one run, built in the parent with the `landlock` crate and handed to the
//! child as a file descriptor (the child only calls `landlock_restrict_self`, see `jail.rs`).
//!
//! What a jailed program may touch: read and execute under the system directories an interpreter
//! or compiler needs (`/usr`, `/bin`, `/lib*`, `/etc`), read `/dev/{urandom,random,zero}`, read
//! and write `/dev/null`, and everything inside its own work dir. Nothing else: not the caller's
//! home, not `/tmp` outside the work dir, not `/proc` (so not `/proc/<pid>/environ`), not `/sys`.
//! With ABI >= 4 TCP bind/connect are denied; with ABI >= 6 signals and abstract Unix sockets
//! cannot reach processes outside the jail.
//!
//! Not here: the decision whether Landlock is used (the probe's) and how it is applied.

use std::os::fd::OwnedFd;
use std::path::Path;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope, path_beneath_rules,
};

/// System directories readable and executable from inside the jail.
const READ_EXECUTE_DIRS: [&str; 7] = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc"];
/// Devices readable from inside the jail.
const READ_DEVICES: [&str; 3] = ["/dev/urandom", "/dev/random", "/dev/zero"];
/// Devices readable and writable from inside the jail.
const READ_WRITE_DEVICES: [&str; 1] = ["/dev/null"];

/// Builds the ruleset for a run whose work dir is `work_dir`, for the kernel's Landlock `abi`
/// version, and returns its descriptor.
pub(crate) fn build_ruleset(
    abi_version: i32,
    work_dir: &Path,
    allow_network: bool,
) -> Result<OwnedFd, String> {
    let abi = ABI::from(abi_version);
    let fail = |what: &str, error: &dyn std::fmt::Display| format!("landlock {what}: {error}");
    let mut ruleset = Ruleset::default()
        // Every right this ABI knows is requested and must be enforced: a partial ruleset
        // would report more confinement than it gives.
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|error| fail("fs access", &error))?;
    if abi_version >= 4 && !allow_network {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(|error| fail("net access", &error))?;
    }
    if abi_version >= 6 {
        ruleset = ruleset
            .scope(Scope::from_all(abi))
            .map_err(|error| fail("scope", &error))?;
    }
    let read = AccessFs::from_read(abi);
    let created = ruleset
        .create()
        .map_err(|error| fail("create", &error))?
        .set_compatibility(CompatLevel::BestEffort)
        .add_rules(path_beneath_rules(READ_EXECUTE_DIRS, read))
        .map_err(|error| fail("system dirs", &error))?
        .add_rules(path_beneath_rules(READ_DEVICES, AccessFs::ReadFile))
        .map_err(|error| fail("devices", &error))?
        .add_rules(path_beneath_rules(
            READ_WRITE_DEVICES,
            AccessFs::ReadFile | AccessFs::WriteFile,
        ))
        .map_err(|error| fail("/dev/null", &error))?
        .set_compatibility(CompatLevel::HardRequirement)
        .add_rules(path_beneath_rules([work_dir], AccessFs::from_all(abi)))
        .map_err(|error| fail("work dir", &error))?;
    let fd: Option<OwnedFd> = created.into();
    fd.ok_or_else(|| "landlock: the kernel does not support it".to_string())
}

/// The Landlock rights a work dir gets (everything this ABI knows), as the kernel's bit mask.
pub(crate) fn work_dir_access_bits(abi_version: i32) -> u64 {
    AccessFs::from_all(ABI::from(abi_version)).bits()
}
