//! [`EpochCursor`]: where a reader is in a run of epochs over `len` items, the one cursor every
//! reader of training items uses (the shard [`crate::loader::Loader`], `stoke train`'s chat
//! source, `stoke dpo`'s preference pairs, `stoke grpo`'s task plan).
//!
//! Epoch `e` visits every item once, in the order [`Shuffle::order`] draws for `e` (item order
//! when shuffling is off); when an epoch is used up the next call moves to the next one, until
//! `max_epochs` (none: forever). Its whole state is [`EpochPosition`], the epoch and the next
//! index into that epoch's order: the order itself is recomputed from the seed, so a cursor put
//! back at a saved position continues exactly.
//!
//! The four readers drew their per-epoch permutations from different seeds before they shared
//! this type, and checkpoints and golden fixtures hold those orders; [`Shuffle`] names each
//! seeding so that every reader keeps its order to the item.
//!
//! What it is not: no shuffle buffer, packing or data-parallel split (the loader's), and no I/O;
//! the readers store the position in their own checkpoint records.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// How each epoch's order is drawn: a ChaCha8 shuffle of `0..len` whose seed comes from the
/// run's seed and the epoch, in one of the ways the readers have always used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shuffle {
    /// Every epoch in item order.
    Off,
    /// Seeded with a splitmix64 draw of `(seed, epoch)`: the shard loader and the chat source.
    Splitmix { seed: u64 },
    /// Seeded with `seed ^ epoch`: preference pairs.
    SeedXorEpoch { seed: u64 },
    /// Seeded with `seed ^ epoch * 0x9E37_79B9_7F4A_7C15`: GRPO's task plan.
    SeedXorScaledEpoch { seed: u64 },
}

/// Mixed into the seed of the splitmix draw, so epoch orders do not repeat other streams.
const STREAM_EPOCH: u64 = 0x94d0_49bb_1331_11eb;
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl Shuffle {
    /// [`Shuffle::Splitmix`] when `shuffle` is on, else [`Shuffle::Off`].
    pub fn splitmix_if(shuffle: bool, seed: u64) -> Shuffle {
        if shuffle {
            Shuffle::Splitmix { seed }
        } else {
            Shuffle::Off
        }
    }

    /// The order of epoch `epoch` over `len` items: a permutation of `0..len`.
    pub fn order(self, len: u64, epoch: u64) -> Vec<u64> {
        let mut order: Vec<u64> = (0..len).collect();
        let seed = match self {
            Shuffle::Off => return order,
            Shuffle::Splitmix { seed } => draw(seed, STREAM_EPOCH, epoch),
            Shuffle::SeedXorEpoch { seed } => seed ^ epoch,
            Shuffle::SeedXorScaledEpoch { seed } => seed ^ epoch.wrapping_mul(GOLDEN),
        };
        // The permutation depends only on the length and the generator, not on the element
        // type, so this is the order the readers drew over `usize` indices too.
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        order
    }
}

/// splitmix64 finalizer over (seed, stream, counter): a counter-based generator whose state is
/// just the counter (the loader's draws for its shuffle buffer and rows use it too).
pub fn draw(seed: u64, stream: u64, counter: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_mul(counter.wrapping_add(1)) ^ counter.rotate_left(17);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The checkpointable state of an [`EpochCursor`]: the epoch and the next index into its order
/// (equal to the item count once an epoch is used up and the next has not been entered).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochPosition {
    pub epoch: u64,
    pub position: u64,
}

/// Epochs over `len` items; see the module doc.
#[derive(Clone, Debug)]
pub struct EpochCursor {
    len: u64,
    shuffle: Shuffle,
    max_epochs: Option<u64>,
    at: EpochPosition,
    /// The order of `order_epoch`, kept so a step costs no reshuffle.
    order: Vec<u64>,
    order_epoch: Option<u64>,
}

impl EpochCursor {
    /// A cursor at the start of epoch 0.
    pub fn new(len: u64, shuffle: Shuffle, max_epochs: Option<u64>) -> EpochCursor {
        EpochCursor {
            len,
            shuffle,
            max_epochs,
            at: EpochPosition::default(),
            order: Vec::new(),
            order_epoch: None,
        }
    }

    /// The same cursor put at a saved position.
    pub fn at(mut self, at: EpochPosition) -> EpochCursor {
        self.seek(at);
        self
    }

    /// Puts the cursor at a saved position.
    pub fn seek(&mut self, at: EpochPosition) {
        self.at = at;
    }

    /// Where the cursor is (what a checkpoint keeps).
    pub fn position(&self) -> EpochPosition {
        self.at
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The next index into the epoch order and its item, entering the next epoch when this one
    /// is used up; `None` once `max_epochs` are used up (the position then stays).
    pub fn next_item(&mut self) -> Option<(u64, u64)> {
        if self.at.position >= self.len {
            let next_epoch = self.at.epoch + 1;
            if self.max_epochs.is_some_and(|max| next_epoch >= max) {
                return None;
            }
            self.at = EpochPosition {
                epoch: next_epoch,
                position: 0,
            };
        }
        if self.order_epoch != Some(self.at.epoch) {
            self.order = self.shuffle.order(self.len, self.at.epoch);
            self.order_epoch = Some(self.at.epoch);
        }
        let position = self.at.position;
        let item = self.order.get(position as usize).copied();
        self.at.position += 1;
        item.map(|item| (position, item))
    }

    /// The item at global index `index` of the unbounded run of epochs (`index / len` is the
    /// epoch), whatever the cursor's position: for readers that address items by a running
    /// number instead of stepping. `len` must not be 0.
    pub fn item_at(&self, index: u64) -> u64 {
        let (epoch, position) = (index / self.len, index % self.len);
        let order = if self.order_epoch == Some(epoch) {
            std::borrow::Cow::Borrowed(&self.order)
        } else {
            std::borrow::Cow::Owned(self.shuffle.order(self.len, epoch))
        };
        order[position as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_epoch_visits_every_item_once_and_max_epochs_stops() {
        let mut cursor = EpochCursor::new(5, Shuffle::Splitmix { seed: 3 }, Some(2));
        let mut seen = Vec::new();
        while let Some((_, item)) = cursor.next_item() {
            seen.push(item);
        }
        assert_eq!(seen.len(), 10);
        for epoch in seen.chunks(5) {
            let mut sorted = epoch.to_vec();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
        }
        assert_eq!(
            cursor.position(),
            EpochPosition {
                epoch: 1,
                position: 5
            }
        );
    }

    /// The next `n` items the cursor gives.
    fn take(cursor: &mut EpochCursor, n: usize) -> Vec<u64> {
        (0..n)
            .filter_map(|_| cursor.next_item())
            .map(|x| x.1)
            .collect()
    }

    #[test]
    fn a_cursor_put_back_at_a_position_continues_exactly() {
        let shuffle = Shuffle::SeedXorEpoch { seed: 11 };
        let all = take(&mut EpochCursor::new(7, shuffle, None), 30);
        let mut first = EpochCursor::new(7, shuffle, None);
        let head = take(&mut first, 12);
        let tail = take(
            &mut EpochCursor::new(7, shuffle, None).at(first.position()),
            18,
        );
        assert_eq!([head, tail].concat(), all);
    }

    #[test]
    fn item_at_follows_the_stepping_order() {
        let mut cursor = EpochCursor::new(4, Shuffle::SeedXorScaledEpoch { seed: 5 }, None);
        let stepped = take(&mut cursor, 12);
        let indexed: Vec<u64> = (0..12).map(|i| cursor.item_at(i)).collect();
        assert_eq!(stepped, indexed);
    }

    #[test]
    fn the_seedings_draw_the_orders_the_readers_drew_over_usize_indices() {
        let drawn_over_usize = |seed: u64| {
            let mut order: Vec<usize> = (0..50).collect();
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
            order.into_iter().map(|i| i as u64).collect::<Vec<u64>>()
        };
        assert_eq!(
            Shuffle::SeedXorEpoch { seed: 7 }.order(50, 3),
            drawn_over_usize(7 ^ 3)
        );
        assert_eq!(
            Shuffle::SeedXorScaledEpoch { seed: 7 }.order(50, 3),
            drawn_over_usize(7 ^ 3u64.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        );
        assert_eq!(
            Shuffle::Splitmix { seed: 7 }.order(50, 3),
            drawn_over_usize(draw(7, STREAM_EPOCH, 3))
        );
    }

    #[test]
    fn shuffle_off_keeps_item_order() {
        assert_eq!(Shuffle::Off.order(4, 9), vec![0, 1, 2, 3]);
    }
}
