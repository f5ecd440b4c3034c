//! [`MemoryBudget`]: the operator-wide allowance of memory for graphs in flight (issue 14,
//! class 3). Each fetch reserves what its body may occupy before reading it, and the
//! [`MemoryReservation`] travels with the bytes so the controller can hold it — and grow it —
//! through decode and validation. Several large fetches therefore wait for one another instead
//! of adding up past the operator's memory limit.
//!
//! Counted in KiB on a tokio semaphore (whose permits are `u32` per acquisition), rounded up.
//! A fetch reserves everything it may need in one acquisition, never piece by piece, so two
//! half-done fetches cannot each hold half the budget while waiting for the rest.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The default budget: 256 MiB.
pub const DEFAULT_GRAPH_MEMORY_BUDGET: u64 = 256 * 1024 * 1024;

const KIB: u64 = 1024;

/// Why a reservation could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// More than the whole budget: it can never be granted.
    #[error("{requested} bytes exceed the whole graph memory budget of {budget} bytes")]
    LargerThanBudget { requested: u64, budget: u64 },
    /// Other graphs held the budget for the whole wait.
    #[error(
        "the graph memory budget of {budget} bytes had no room for {requested} bytes for \
         {waited:?}"
    )]
    Exhausted {
        requested: u64,
        budget: u64,
        waited: Duration,
    },
}

/// A shared allowance of bytes. Cloning shares it.
#[derive(Clone)]
pub struct MemoryBudget {
    semaphore: Arc<Semaphore>,
    total_kib: u32,
}

impl fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("total_bytes", &self.total_bytes())
            .field("available_bytes", &self.available_bytes())
            .finish()
    }
}

impl Default for MemoryBudget {
    fn default() -> Self {
        Self::new(DEFAULT_GRAPH_MEMORY_BUDGET)
    }
}

/// `bytes` in KiB, rounded up and saturating at `u32::MAX` KiB (4 TiB).
fn kib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(KIB)).unwrap_or(u32::MAX)
}

impl MemoryBudget {
    /// A budget of `bytes` (rounded up to whole KiB).
    pub fn new(bytes: u64) -> Self {
        let total_kib = kib(bytes);
        Self {
            semaphore: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
        }
    }

    pub fn total_bytes(&self) -> u64 {
        u64::from(self.total_kib) * KIB
    }

    pub fn available_bytes(&self) -> u64 {
        self.semaphore.available_permits() as u64 * KIB
    }

    /// Reserves `bytes`, waiting up to `wait` for other reservations to be released.
    pub async fn reserve(
        &self,
        bytes: u64,
        wait: Duration,
    ) -> Result<MemoryReservation, BudgetError> {
        let permit = self.acquire(kib(bytes), wait).await?;
        Ok(MemoryReservation {
            budget: self.clone(),
            permit,
        })
    }

    /// Reserves `bytes` if they are free now.
    pub fn try_reserve(&self, bytes: u64) -> Option<MemoryReservation> {
        let permit = self
            .semaphore
            .clone()
            .try_acquire_many_owned(kib(bytes))
            .ok()?;
        Some(MemoryReservation {
            budget: self.clone(),
            permit,
        })
    }

    async fn acquire(&self, kib: u32, wait: Duration) -> Result<OwnedSemaphorePermit, BudgetError> {
        if kib > self.total_kib {
            return Err(BudgetError::LargerThanBudget {
                requested: u64::from(kib) * KIB,
                budget: self.total_bytes(),
            });
        }
        let acquired =
            tokio::time::timeout(wait, self.semaphore.clone().acquire_many_owned(kib)).await;
        match acquired {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; treat it like a full budget all the same.
            Ok(Err(_)) | Err(_) => Err(BudgetError::Exhausted {
                requested: u64::from(kib) * KIB,
                budget: self.total_bytes(),
                waited: wait,
            }),
        }
    }
}

/// Bytes held from a [`MemoryBudget`]; released when dropped.
pub struct MemoryReservation {
    budget: MemoryBudget,
    permit: OwnedSemaphorePermit,
}

impl fmt::Debug for MemoryReservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryReservation")
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl MemoryReservation {
    /// The bytes held (a multiple of 1 KiB).
    pub fn bytes(&self) -> u64 {
        self.permit.num_permits() as u64 * KIB
    }

    /// Grows the reservation to hold `bytes` in all (nothing happens if it already does),
    /// waiting up to `wait`. The added part is acquired in one piece; on failure the
    /// reservation keeps what it had. Decoding a graph costs a multiple of its wire size: the
    /// caller grows the reservation by that factor before decoding.
    pub async fn grow_to(&mut self, bytes: u64, wait: Duration) -> Result<(), BudgetError> {
        let wanted = kib(bytes);
        let held = self.held_kib();
        if wanted <= held {
            return Ok(());
        }
        if wanted > self.budget.total_kib {
            return Err(BudgetError::LargerThanBudget {
                requested: u64::from(wanted) * KIB,
                budget: self.budget.total_bytes(),
            });
        }
        let more = self
            .budget
            .acquire(wanted - held, wait)
            .await
            .map_err(|error| match error {
                // Name the whole size wanted, not just the missing part.
                BudgetError::Exhausted { budget, waited, .. } => BudgetError::Exhausted {
                    requested: u64::from(wanted) * KIB,
                    budget,
                    waited,
                },
                other => other,
            })?;
        self.permit.merge(more);
        Ok(())
    }

    /// Releases what is held beyond `bytes` (rounded up to KiB).
    pub fn shrink_to(&mut self, bytes: u64) {
        let keep = kib(bytes);
        let held = self.held_kib();
        if keep < held {
            // The split-off permits go back to the budget when dropped here.
            drop(self.permit.split((held - keep) as usize));
        }
    }

    fn held_kib(&self) -> u32 {
        u32::try_from(self.permit.num_permits()).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;
    const NO_WAIT: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn reservations_count_against_the_budget_until_dropped() {
        let budget = MemoryBudget::new(10 * MIB);
        let first = budget.reserve(6 * MIB, NO_WAIT).await.expect("fits");
        assert_eq!(first.bytes(), 6 * MIB);
        assert_eq!(budget.available_bytes(), 4 * MIB);
        let refused = budget.reserve(5 * MIB, NO_WAIT).await.expect_err("full");
        assert!(
            matches!(refused, BudgetError::Exhausted { .. }),
            "{refused}"
        );
        assert!(budget.try_reserve(5 * MIB).is_none());
        drop(first);
        assert_eq!(budget.available_bytes(), 10 * MIB);
        assert!(budget.try_reserve(5 * MIB).is_some());
    }

    #[tokio::test]
    async fn bytes_are_rounded_up_to_whole_kib() {
        let budget = MemoryBudget::new(1000);
        assert_eq!(budget.total_bytes(), 1024);
        let one = budget.reserve(1, NO_WAIT).await.expect("one byte");
        assert_eq!(one.bytes(), 1024);
        assert!(budget.try_reserve(1).is_none());
        let zero = budget.try_reserve(0).expect("nothing is always free");
        assert_eq!(zero.bytes(), 0);
    }

    #[tokio::test]
    async fn more_than_the_whole_budget_fails_at_once() {
        let budget = MemoryBudget::new(MIB);
        let started = std::time::Instant::now();
        let error = budget
            .reserve(2 * MIB, Duration::from_secs(30))
            .await
            .expect_err("never fits");
        assert_eq!(
            error,
            BudgetError::LargerThanBudget {
                requested: 2 * MIB,
                budget: MIB
            }
        );
        assert!(started.elapsed() < Duration::from_secs(1));
        // Absurd sizes saturate rather than overflow.
        assert!(budget.reserve(u64::MAX, NO_WAIT).await.is_err());
    }

    #[tokio::test]
    async fn a_waiting_reservation_proceeds_when_the_other_is_released() {
        let budget = MemoryBudget::new(4 * MIB);
        let holder = budget.reserve(3 * MIB, NO_WAIT).await.expect("fits");
        let waiter = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.reserve(2 * MIB, Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "must wait while the budget is held");
        drop(holder);
        let granted = waiter.await.expect("task").expect("granted after release");
        assert_eq!(granted.bytes(), 2 * MIB);
        assert_eq!(budget.available_bytes(), 2 * MIB);
    }

    #[tokio::test]
    async fn reservations_grow_and_shrink() {
        let budget = MemoryBudget::new(8 * MIB);
        let mut reservation = budget.reserve(MIB, NO_WAIT).await.expect("fits");
        reservation.grow_to(5 * MIB, NO_WAIT).await.expect("grows");
        assert_eq!(reservation.bytes(), 5 * MIB);
        assert_eq!(budget.available_bytes(), 3 * MIB);
        // Growing to less than held changes nothing.
        reservation.grow_to(2 * MIB, NO_WAIT).await.expect("no-op");
        assert_eq!(reservation.bytes(), 5 * MIB);
        // Growing past what is free fails and keeps what was held.
        let other = budget.reserve(3 * MIB, NO_WAIT).await.expect("fits");
        let error = reservation
            .grow_to(6 * MIB, NO_WAIT)
            .await
            .expect_err("full");
        assert!(matches!(error, BudgetError::Exhausted { .. }));
        assert_eq!(reservation.bytes(), 5 * MIB);
        let error = reservation
            .grow_to(9 * MIB, NO_WAIT)
            .await
            .expect_err("too big");
        assert!(matches!(error, BudgetError::LargerThanBudget { .. }));
        drop(other);
        reservation.shrink_to(MIB + 1);
        assert_eq!(reservation.bytes(), MIB + 1024);
        assert_eq!(budget.available_bytes(), 8 * MIB - MIB - 1024);
        drop(reservation);
        assert_eq!(budget.available_bytes(), 8 * MIB);
    }
}
