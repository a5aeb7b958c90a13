//! The workspace's documents agree with the workspace: the crate tables of README.md and
//! ARCHITECTURE.md list exactly the members of the root Cargo.toml, and docs/figures.md is
//! exactly what `tools/figures.py` writes from docs/perf/. (They live in the test kit because
//! they check the whole workspace, not one crate.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `members = [..]` of the `[workspace]` table of the root Cargo.toml.
fn workspace_members() -> BTreeSet<String> {
    let toml = read("Cargo.toml");
    let start = toml.find("members").expect("Cargo.toml has no `members`");
    let open = start + toml[start..].find('[').expect("members = [");
    let close = open + toml[open..].find(']').expect("members = [..]");
    toml[open + 1..close]
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The crates a document's crate table names: every table row whose first cell is
/// `` `crates/<name>` `` (possibly followed by more text in that cell).
fn crate_rows(doc: &str) -> BTreeSet<String> {
    read(doc)
        .lines()
        .filter_map(|l| l.strip_prefix("| `crates/"))
        .map(|rest| format!("crates/{}", &rest[..rest.find('`').expect("closing `")]))
        .collect()
}

fn check_crate_table(doc: &str) {
    let members = workspace_members();
    let listed = crate_rows(doc);
    assert!(
        members.len() >= 6,
        "read too few workspace members: {members:?}"
    );
    assert_eq!(
        listed, members,
        "{doc}'s crate table (rows starting with | `crates/..`) must list exactly the workspace \
         members of Cargo.toml: add a row for each new member, remove the rows of removed ones"
    );
}

#[test]
fn readme_lists_every_workspace_member_and_nothing_else() {
    check_crate_table("README.md");
}

#[test]
fn architecture_lists_every_workspace_member_and_nothing_else() {
    check_crate_table("ARCHITECTURE.md");
}

#[test]
fn figures_md_is_the_output_of_the_figures_script() {
    let out = Command::new("python3")
        .arg(root().join("tools/figures.py"))
        .arg("--check")
        .output()
        .expect("run python3 tools/figures.py --check (is python3 installed?)");
    assert!(
        out.status.success(),
        "docs/figures.md differs from what tools/figures.py writes; run `python3 tools/figures.py` \
         after changing docs/perf/*.csv or docs/perf/*.md (never edit docs/figures.md by hand):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
