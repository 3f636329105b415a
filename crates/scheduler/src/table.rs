//! The endpoint table: a slab of endpoint states addressed by slot, a dense list of the live
//! slots (the candidate order), and the index from address to slot (crate-internal).
//!
//! Slots are reused after an endpoint leaves; each slot's generation tells the reuses apart, so an
//! in-flight entry of a removed endpoint never charges or teaches its successor.

use std::collections::HashMap;
use std::net::SocketAddr;

use crate::endpoint::EndpointMeta;
use crate::state::EndpointState;

/// A slot of the endpoint table. Slots are reused; the generation tells reuses apart.
#[derive(Clone, Debug, Default)]
struct Slot {
    generation: u32,
    state: Option<EndpointState>,
    /// Position in the dense list of live slots.
    live_pos: u32,
}

/// What [`EndpointTable::upsert`] did.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Upsert {
    /// The address was known: identity and labels replaced, everything else kept.
    Updated,
    /// A new endpoint, in this slot.
    Added(u32),
}

/// Every endpoint of the pool.
#[derive(Default)]
pub(crate) struct EndpointTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: Vec<u32>,
    by_addr: HashMap<SocketAddr, u32>,
}

impl EndpointTable {
    /// Adds an endpoint, or replaces the identity and labels of the one at `meta.addr`.
    pub(crate) fn upsert(&mut self, meta: EndpointMeta) -> Upsert {
        if let Some(&slot) = self.by_addr.get(&meta.addr) {
            if let Some(ep) = self.slots[slot as usize].state.as_mut() {
                ep.cold.meta = meta;
            }
            return Upsert::Updated;
        }
        let addr = meta.addr;
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot::default());
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let s = &mut self.slots[slot as usize];
        s.state = Some(EndpointState::new(meta));
        s.live_pos = u32::try_from(self.live.len()).unwrap_or(u32::MAX);
        self.live.push(slot);
        self.by_addr.insert(addr, slot);
        Upsert::Added(slot)
    }

    /// Removes the endpoint at `addr`: its slot and its state (`None` when not in the pool). The
    /// slot's generation moves on, so entries charged to it no longer reach it.
    pub(crate) fn remove(&mut self, addr: SocketAddr) -> Option<(u32, Option<EndpointState>)> {
        let slot = self.by_addr.remove(&addr)?;
        let s = &mut self.slots[slot as usize];
        let pos = s.live_pos as usize;
        let state = s.state.take();
        s.generation = s.generation.wrapping_add(1);
        self.live.swap_remove(pos);
        if let Some(&moved) = self.live.get(pos) {
            self.slots[moved as usize].live_pos = u32::try_from(pos).unwrap_or(u32::MAX);
        }
        self.free.push(slot);
        Some((slot, state))
    }

    /// The slot of the endpoint at `addr`.
    pub(crate) fn slot_of(&self, addr: &SocketAddr) -> Option<u32> {
        self.by_addr.get(addr).copied()
    }

    /// The endpoint in `slot`.
    #[inline]
    pub(crate) fn get(&self, slot: u32) -> Option<&EndpointState> {
        self.slots.get(slot as usize)?.state.as_ref()
    }

    /// The endpoint in `slot`, mutably.
    pub(crate) fn get_mut(&mut self, slot: u32) -> Option<&mut EndpointState> {
        self.slots.get_mut(slot as usize)?.state.as_mut()
    }

    /// The current generation of `slot` (0 for a slot never used).
    pub(crate) fn generation(&self, slot: u32) -> u32 {
        self.slots.get(slot as usize).map_or(0, |s| s.generation)
    }

    /// The endpoint in `slot`, if the slot still holds the one of `generation`.
    pub(crate) fn current_mut(&mut self, slot: u32, generation: u32) -> Option<&mut EndpointState> {
        let s = self.slots.get_mut(slot as usize)?;
        if s.generation != generation {
            return None;
        }
        s.state.as_mut()
    }

    /// Slots ever allocated (live or free): the size of per-slot scratch buffers.
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The live slots, in pool order.
    pub(crate) fn live(&self) -> &[u32] {
        &self.live
    }

    /// Endpoints in the pool.
    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }

    /// The endpoints in the pool, in pool order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &EndpointState> + '_ {
        self.live.iter().filter_map(|&s| self.get(s))
    }
}
