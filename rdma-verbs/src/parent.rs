//! How a resource holds the resource it was made from: [`Parent`].
//!
//! Every verbs resource needs its parent alive (a PD its context, an MR its PD, a QP its PD and
//! CQs). A [`Parent`] is either a **borrow**, which the compiler checks (the parent outlives the
//! child, with no runtime cost), or a **reference count** ([`Arc`]), which keeps the parent
//! alive for as long as any child holds it. The borrowed form keeps the compile-time ties; the
//! shared form gives `'static` resources that a thread or a task can own and that fit in one
//! struct:
//!
//! ```no_run
//! use std::sync::Arc;
//! use rdma_verbs::*;
//!
//! # fn main() -> rdma_verbs::Result<()> {
//! // Borrowed: the lifetimes tie the PD to `ctx`.
//! let ctx = Context::open("rxe0")?;
//! let pd = ctx.alloc_pd()?;
//!
//! // Shared: a `ProtectionDomain<'static>` that keeps its context open, movable into a thread.
//! let ctx = Arc::new(Context::open("rxe0")?);
//! let pd: ProtectionDomain<'static> = ProtectionDomain::new(ctx.clone())?;
//! std::thread::spawn(move || {
//!     let mr = MemoryRegion::alloc(Arc::new(pd), 4096, AccessFlags::LOCAL_WRITE);
//! });
//! # Ok(()) }
//! ```
//!
//! Either form is made with `.into()` from `&T` or `Arc<T>`: constructors take
//! `impl Into<Parent<..>>`.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A resource's parent: borrowed (checked at compile time) or shared (reference counted).
///
/// Dereferences to the parent. See the [module docs](self).
pub enum Parent<'a, T> {
    /// A borrow: the parent outlives the child, which the compiler checks.
    Borrowed(&'a T),
    /// A reference count: the parent lives until its last child (and handle) is gone.
    Shared(Arc<T>),
}

impl<T> Deref for Parent<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        match self {
            Parent::Borrowed(r) => r,
            Parent::Shared(a) => a,
        }
    }
}

impl<T> Clone for Parent<'_, T> {
    fn clone(&self) -> Self {
        match self {
            Parent::Borrowed(r) => Parent::Borrowed(r),
            Parent::Shared(a) => Parent::Shared(Arc::clone(a)),
        }
    }
}

impl<'a, T> From<&'a T> for Parent<'a, T> {
    fn from(r: &'a T) -> Self {
        Parent::Borrowed(r)
    }
}

impl<T> From<Arc<T>> for Parent<'_, T> {
    fn from(a: Arc<T>) -> Self {
        Parent::Shared(a)
    }
}

impl<'a, T> From<&'a Arc<T>> for Parent<'a, T> {
    /// Borrows what the `Arc` points to (no reference count taken).
    fn from(a: &'a Arc<T>) -> Self {
        Parent::Borrowed(a)
    }
}

impl<T: fmt::Debug> fmt::Debug for Parent<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl<T> Parent<'_, T> {
    /// Whether both handles reach the same parent.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        std::ptr::eq::<T>(&**a, &**b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_reach_the_parent() {
        let owned = Arc::new(7u32);
        let shared: Parent<'static, u32> = owned.clone().into();
        assert_eq!(*shared, 7);
        assert_eq!(Arc::strong_count(&owned), 2, "the shared form holds a count");
        let local = 9u32;
        let borrowed: Parent<'_, u32> = (&local).into();
        assert_eq!(*borrowed, 9);
        let clone = shared.clone();
        assert!(Parent::ptr_eq(&clone, &shared));
        assert_eq!(Arc::strong_count(&owned), 3);
        drop((shared, clone));
        assert_eq!(Arc::strong_count(&owned), 1, "dropping the children releases the parent");
    }
}
