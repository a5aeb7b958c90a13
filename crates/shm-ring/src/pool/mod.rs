//! The producer's payload pool: loans of pool memory, and the large size class's extents.

pub(crate) mod alloc;
pub(crate) mod large;
mod loan;
mod view;

pub use loan::{ArrayLoan, ArrayLoanUninit, BlockPin};
pub(crate) use loan::{LoanToken, PoolGeom, PoolHome};
pub(crate) use view::PoolRef;
