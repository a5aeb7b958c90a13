//! The reorder buffer of the ordered mode (consumer side).
//!
//! It holds outputs of records that are ahead of the release cursor, so it is where a slow
//! emitter or a hostile worker could make the consumer hold memory without bound (issue 16).
//! What the emitters may issue is the consumer's own grant ([`Credit`]), which follows the
//! cursor and the buffer's size; every index is checked against it, and groups already
//! released or already complete take no more items: such a frame is an error naming what is
//! wrong (the caller adds the worker).

use std::collections::HashMap;

use crate::credit::Credit;
use crate::item::Item;
use crate::ready::Ready;
use crate::wire::{FINISH_E, FINISH_K};

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
    /// Approximate bytes held in `groups` (see [`approx_size`]).
    bytes: usize,
    /// Mean approximate size of the groups released so far (a moving average; 0: none yet).
    mean_group: usize,
    /// What each emitter may issue: granted by this buffer as it releases.
    credit: Credit,
}

/// What an item is counted as in the buffer's size: its arrays and a fixed part for the rest.
fn approx_size(item: &Item) -> usize {
    256 + item.nbytes()
}

/// What a group is counted as besides its items (its key and place in the map).
const GROUP_SIZE: usize = 64;

impl Reorder {
    pub(crate) fn new(emitters: usize, credit: Credit) -> Reorder {
        Reorder {
            emitters: emitters as u32,
            counts: vec![None; emitters],
            k: 0,
            e: 0,
            groups: HashMap::new(),
            bytes: 0,
            mean_group: 0,
            credit,
        }
    }

    /// Checks that record `k` of emitter `e` was granted and not released yet.
    fn check(&mut self, e: u32, k: u64) -> Result<(), String> {
        if e >= self.emitters {
            return Err(format!(
                "an output of emitter {e}, which does not exist ({} emitters)",
                self.emitters
            ));
        }
        let granted = self.credit.granted(e as usize);
        if k >= granted {
            return Err(format!(
                "an output of record {k} of emitter {e}, which may have issued only {granted} \
                 records"
            ));
        }
        if (k, e) < (self.k, self.e) {
            return Err(format!(
                "an output of record {k} of emitter {e}, whose outputs were all delivered"
            ));
        }
        Ok(())
    }

    /// Adds an output (`None`: an empty group's end) of record `(e, k)`; `last`: the last of
    /// its group.
    ///
    /// # Errors
    /// A record never issued, already delivered, or whose group was already complete.
    pub(crate) fn add(
        &mut self,
        e: u32,
        k: u64,
        item: Option<Item>,
        last: bool,
    ) -> Result<(), String> {
        // Outputs of `Step::finish` have no record: they go out at the end, in arrival order.
        if (e, k) != (FINISH_E, FINISH_K) {
            self.check(e, k)?;
        }
        let g = self.groups.entry((k, e)).or_default();
        if g.1 && (e, k) != (FINISH_E, FINISH_K) {
            return Err(format!(
                "an output of record {k} of emitter {e} after the last of its group"
            ));
        }
        if let Some(item) = item {
            self.bytes += approx_size(&item);
            g.0.push(item);
        }
        g.1 |= last;
        Ok(())
    }

    /// Emitter `e` says it sent `n` records in all.
    ///
    /// # Errors
    /// An emitter that does not exist, or more records than it may have issued.
    pub(crate) fn emitter_done(&mut self, e: u32, n: u64) -> Result<(), String> {
        let ei = e as usize;
        if e >= self.emitters || n > self.credit.granted(ei) {
            return Err(format!(
                "end of emitter {e} after {n} records, which it may not have issued"
            ));
        }
        self.counts[ei] = Some(n);
        Ok(())
    }

    /// Moves every group that may go now, in order, to `ready` (each ending its input there),
    /// then grants the emitters what the new cursor and the buffer's size allow.
    pub(crate) fn release(&mut self, ready: &mut Ready) {
        self.advance(ready);
        let (k, e) = (self.k, self.e);
        // Records of emitter `x` delivered: `0..k`, and record `k` too for emitters before `e`.
        let released = |x: usize| k + u64::from((x as u32) < e);
        self.credit
            .update(released, self.groups.len(), self.bytes, self.mean_group);
    }

    fn advance(&mut self, ready: &mut Ready) {
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
                        let size: usize = items.iter().map(approx_size).sum();
                        self.bytes = self.bytes.saturating_sub(size);
                        let size = size + GROUP_SIZE;
                        self.mean_group = if self.mean_group == 0 {
                            size
                        } else {
                            self.mean_group - self.mean_group / 8 + size / 8
                        };
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
        self.bytes = 0;
        let mut rest: Vec<_> = self.groups.drain().collect();
        rest.sort_by_key(|(key, _)| *key);
        ready.extend(rest.into_iter().flat_map(|(_, (items, _))| items));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credit::{Gate, Grantee};
    use crate::item::Item;
    use std::sync::Arc;

    fn item(n: i64) -> Item {
        Item::new().with_meta("n", n)
    }

    /// A reorder buffer over `emitters` emitters that were granted `granted[e]` records each,
    /// with a window of one record (so releases grant at most the next record of each).
    fn reorder(granted: &[u64]) -> (Reorder, Arc<Gate>) {
        let gate = Arc::new(Gate::new(0));
        let mut c = Credit::new(granted.len(), 1, Grantee::Local(Arc::clone(&gate)));
        c.set_granted(granted);
        (Reorder::new(granted.len(), c), gate)
    }

    #[test]
    fn reorder_releases_groups_in_k_then_e_order_and_skips_ended_emitters() {
        let (mut r, _) = reorder(&[3, 1]);
        let mut ready = Ready::default();
        // Emitter 1 has one record, emitter 0 has three; groups arrive out of order.
        r.add(0, 1, Some(item(10)), false).unwrap();
        r.add(0, 1, Some(item(11)), true).unwrap();
        r.add(1, 0, None, true).unwrap(); // record (e=1, k=0) had no outputs
        r.release(&mut ready);
        assert!(ready.pop().is_none(), "(k=0, e=0) is still missing");
        r.add(0, 0, Some(item(0)), true).unwrap();
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
        r.add(0, 2, Some(item(20)), true).unwrap();
        r.release(&mut ready);
        assert_eq!(ns(&mut ready).len(), 3, "(k=1, e=1) may still come");
        // Emitter 1 ended after one record: (k=1, e=1) is skipped.
        r.emitter_done(1, 1).unwrap();
        r.release(&mut ready);
        assert_eq!(ns(&mut ready), vec![0, 10, 11, 20]);
        assert_eq!(ready.done(), 4);
        r.emitter_done(0, 3).unwrap();
        r.release(&mut ready);
        assert_eq!(ns(&mut ready).len(), 4);
        assert!(r.groups.is_empty());
    }

    /// Issue 16 (suspected, confirmed): a hostile worker could grow the reorder buffer without
    /// bound with indices far ahead of anything issued; they were kept until the end.
    #[test]
    fn indices_never_issued_are_not_kept() {
        let (mut r, _) = reorder(&[3]);
        let mut ready = Ready::default();
        for i in 0..10_000u64 {
            let e = r.add(0, (1 << 40) + i, Some(item(i as i64)), true);
            assert!(e.unwrap_err().contains("issued only 3 records"));
        }
        r.release(&mut ready);
        assert!(ready.pop().is_none());
        assert_eq!(r.groups.len(), 0, "far-ahead groups kept");
        // Emitters that do not exist, delivered groups, items after the last, ends of
        // records never issued: refused too.
        assert!(r.add(1, 0, Some(item(0)), true).is_err());
        r.add(0, 0, Some(item(0)), true).unwrap();
        r.release(&mut ready);
        assert!(
            r.add(0, 0, Some(item(1)), true)
                .unwrap_err()
                .contains("delivered")
        );
        r.add(0, 2, Some(item(2)), true).unwrap();
        assert!(
            r.add(0, 2, Some(item(3)), false)
                .unwrap_err()
                .contains("after the last")
        );
        assert!(r.emitter_done(0, 4).is_err());
        assert!(r.emitter_done(5, 0).is_err());
        // Outputs of `finish` belong to no record.
        r.add(FINISH_E, FINISH_K, Some(item(9)), false).unwrap();
        r.add(FINISH_E, FINISH_K, Some(item(9)), false).unwrap();
    }
}
