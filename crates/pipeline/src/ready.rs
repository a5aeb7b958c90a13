//! The consumer's queue of outputs ready to be dequeued, which also counts the inputs whose
//! outputs have all been dequeued ([`Pipeline::inputs_done`](crate::Pipeline::inputs_done)).

use std::collections::VecDeque;

use crate::item::Item;

/// Outputs in dequeue order, and where each input's group of outputs ends.
#[derive(Debug, Default)]
pub(crate) struct Ready {
    items: VecDeque<Item>,
    /// For every group end not yet reached by [`Ready::pop`]: the number of items pushed
    /// before it (non-decreasing).
    ends: VecDeque<u64>,
    /// Items pushed / popped so far.
    pushed: u64,
    popped: u64,
    /// Groups whose every item was popped.
    done: u64,
}

impl Ready {
    pub(crate) fn push(&mut self, item: Item) {
        self.items.push_back(item);
        self.pushed += 1;
    }

    /// The group of one input ends after the items pushed so far (it may have had none).
    pub(crate) fn end_group(&mut self) {
        self.ends.push_back(self.pushed);
        self.advance();
    }

    pub(crate) fn pop(&mut self) -> Option<Item> {
        let it = self.items.pop_front()?;
        self.popped += 1;
        self.advance();
        Some(it)
    }

    fn advance(&mut self) {
        while self.ends.front().is_some_and(|&at| at <= self.popped) {
            self.ends.pop_front();
            self.done += 1;
        }
    }

    /// Inputs whose every output was popped.
    pub(crate) fn done(&self) -> u64 {
        self.done
    }

    /// Items not yet popped.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn extend(&mut self, items: impl IntoIterator<Item = Item>) {
        items.into_iter().for_each(|it| self.push(it));
    }

    /// Drops what is queued (a failed pipeline); the counts stay.
    pub(crate) fn clear(&mut self) {
        self.popped += self.items.len() as u64;
        self.items.clear();
        self.ends.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_is_done_when_its_last_output_is_popped() {
        let mut r = Ready::default();
        let it = || Item::new();
        r.push(it());
        r.push(it());
        r.end_group(); // input 0: two outputs
        r.end_group(); // input 1: none
        r.push(it());
        assert_eq!(r.done(), 0);
        assert!(r.pop().is_some());
        assert_eq!(r.done(), 0, "input 0 has one more output");
        assert!(r.pop().is_some());
        assert_eq!(r.done(), 2, "input 1 had none: done with input 0");
        assert!(r.pop().is_some());
        assert_eq!(r.done(), 2, "the group of input 2 has not ended");
        r.end_group();
        assert_eq!(r.done(), 3);
        assert!(r.pop().is_none());
    }
}
