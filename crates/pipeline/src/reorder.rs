//! The reorder buffer of the ordered mode (consumer side).

use std::collections::HashMap;

use crate::item::Item;
use crate::ready::Ready;

/// The reorder buffer of the ordered mode: groups of outputs keyed by input `(k, e)`,
/// released in the order `k`, then `e`.
#[derive(Debug)]
pub(crate) struct Reorder {
    emitters: u32,
    /// Records sent by each emitter, once known.
    pub(crate) counts: Vec<Option<u64>>,
    /// Cursor: the next group to release is `(k, e)`.
    k: u64,
    e: u32,
    groups: HashMap<(u64, u32), (Vec<Item>, bool)>,
}

impl Reorder {
    pub(crate) fn new(emitters: usize) -> Reorder {
        Reorder {
            emitters: emitters as u32,
            counts: vec![None; emitters],
            k: 0,
            e: 0,
            groups: HashMap::new(),
        }
    }
    pub(crate) fn add(&mut self, e: u32, k: u64, item: Option<Item>, last: bool) {
        let g = self.groups.entry((k, e)).or_default();
        g.0.extend(item);
        g.1 |= last;
    }
    /// Moves every group that may go now, in order, to `ready` (each ending its input there).
    pub(crate) fn release(&mut self, ready: &mut Ready) {
        loop {
            let all_known = self.counts.iter().all(|c| c.is_some_and(|n| self.k >= n));
            if all_known {
                return;
            }
            let skip = self.counts[self.e as usize].is_some_and(|n| self.k >= n);
            if !skip {
                match self.groups.get(&(self.k, self.e)) {
                    Some((_, true)) => {
                        let (items, _) = self.groups.remove(&(self.k, self.e)).unwrap_or_default();
                        ready.extend(items);
                        ready.end_group();
                    }
                    _ => return,
                }
            }
            self.e += 1;
            if self.e == self.emitters {
                self.e = 0;
                self.k += 1;
            }
        }
    }
    /// End of stream: what is left (the outputs of `finish`, which belong to no input).
    pub(crate) fn flush(&mut self, ready: &mut Ready) {
        let mut rest: Vec<_> = self.groups.drain().collect();
        rest.sort_by_key(|(key, _)| *key);
        ready.extend(rest.into_iter().flat_map(|(_, (items, _))| items));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::Item;

    fn item(n: i64) -> Item {
        Item::new().with_meta("n", n)
    }

    #[test]
    fn reorder_releases_groups_in_k_then_e_order_and_skips_ended_emitters() {
        let mut r = Reorder::new(2);
        let mut ready = Ready::default();
        // Emitter 1 has one record, emitter 0 has three; groups arrive out of order.
        r.add(0, 1, Some(item(10)), false);
        r.add(0, 1, Some(item(11)), true);
        r.add(1, 0, None, true); // record (e=1, k=0) had no outputs
        r.release(&mut ready);
        assert!(ready.pop().is_none(), "(k=0, e=0) is still missing");
        r.add(0, 0, Some(item(0)), true);
        r.release(&mut ready);
        // (0,0), then the empty group (0,1), then (1,0); (1,1) is unknown yet.
        let mut popped = Vec::new();
        let mut ns = |ready: &mut Ready| {
            while let Some(i) = ready.pop() {
                popped.push(i.i64("n").unwrap());
            }
            popped.clone()
        };
        assert_eq!(ns(&mut ready), vec![0, 10, 11]);
        assert_eq!(ready.done(), 3, "(0,0), (0,1) and (1,0) are done");
        r.add(0, 2, Some(item(20)), true);
        r.release(&mut ready);
        assert_eq!(ns(&mut ready).len(), 3, "(k=1, e=1) may still come");
        // Emitter 1 ended after one record: (k=1, e=1) is skipped.
        r.counts[1] = Some(1);
        r.release(&mut ready);
        assert_eq!(ns(&mut ready), vec![0, 10, 11, 20]);
        assert_eq!(ready.done(), 4);
        r.counts[0] = Some(3);
        r.release(&mut ready);
        assert_eq!(ns(&mut ready).len(), 4);
        assert!(r.groups.is_empty());
    }
}
