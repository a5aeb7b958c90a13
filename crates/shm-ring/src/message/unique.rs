//! Field names unique within a record, checked in time linear in the number of fields: a few
//! names are compared in place, more go into a hash set (a record of 32,000 fields took 0.67 s
//! to check pairwise, a 16 MiB block minutes, and `recv_timeout` cannot interrupt it: review
//! 17; sending such a message was quadratic too).

use std::collections::HashSet;

use smallvec::SmallVec;

/// Up to this many names are compared in place; past it, a hash set holds them.
const IN_PLACE: usize = 16;

/// The names of one record seen so far.
#[derive(Debug, Default)]
pub(crate) struct UniqueNames<'a> {
    few: SmallVec<[&'a str; IN_PLACE]>,
    /// Made only when a record has more than `IN_PLACE` names: most never need it (and a
    /// `HashSet`'s hasher is seeded on creation, a cost on every received message).
    many: Option<HashSet<&'a str>>,
}

impl<'a> UniqueNames<'a> {
    /// Adds `name`; `false` if the record already has it.
    pub(crate) fn insert(&mut self, name: &'a str) -> bool {
        if self.few.len() < IN_PLACE {
            if self.few.contains(&name) {
                return false;
            }
            self.few.push(name);
            return true;
        }
        let many = self.many.get_or_insert_with(HashSet::new);
        if many.is_empty() {
            many.extend(self.few.iter().copied());
        }
        many.insert(name)
    }

    /// Forgets every name (the next record begins).
    pub(crate) fn clear(&mut self) {
        self.few.clear();
        if let Some(many) = &mut self.many {
            many.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_name_is_found_among_few_and_among_many() {
        for n in [3usize, IN_PLACE, IN_PLACE + 1, 1000] {
            let names: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
            let mut seen = UniqueNames::default();
            assert!(names.iter().all(|s| seen.insert(s)), "{n} unique names");
            for s in [&names[0], &names[n / 2], &names[n - 1]] {
                assert!(!seen.insert(s), "{s} again among {n}");
            }
            seen.clear();
            assert!(seen.insert(&names[0]), "after clear");
            // The next record: its first names are found again past the in-place ones.
            seen.clear();
            assert!(
                names.iter().all(|s| seen.insert(s)),
                "{n} unique names again"
            );
            assert!(
                !seen.insert(&names[0]),
                "the first of {n} again, after a clear"
            );
        }
    }
}
