//! An open device: [`Context`].

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use crate::ffi;

use crate::device::DeviceList;
use crate::device_attr::DeviceAttr;
use crate::device_attr_ex::{DeviceAttrEx, DeviceCapabilities, OdpCapabilities};
use crate::error::{Error, Result};
use crate::gid::GidEntry;
use crate::port::PortAttr;

/// An open RDMA device (`struct ibv_context`), closed on drop.
///
/// Every other verbs resource holds its context (borrowed, or by `Arc`: see
/// [`Parent`](crate::Parent)), so a context outlives all of them. When it drops, it destroys the
/// objects whose wrappers were forgotten (or failed to destroy them), then closes the device.
/// libibverbs is thread-safe: a `Context` can be shared between threads.
///
/// ```no_run
/// # fn main() -> rdma_verbs::Result<()> {
/// let ctx = rdma_verbs::Context::open("rxe0")?;
/// let port = ctx.query_port(1)?;
/// println!("{}: {:?}, MTU {:?}", ctx.name(), port.state, port.active_mtu);
/// # Ok(()) }
/// ```
///
/// # References
/// - [`ibv_open_device(3)`](https://man7.org/linux/man-pages/man3/ibv_open_device.3.html)
#[doc(alias = "ibv_context")]
#[derive(Debug)]
#[must_use = "dropping it at once releases what was just made"]
pub struct Context {
    raw: NonNull<ffi::ibv_context>,
    name: String,
    attr: DeviceAttr,
    capabilities: DeviceCapabilities,
    odp: OdpCapabilities,
    registry: crate::registry::Registry,
}

// SAFETY: libibverbs' device verbs are thread-safe (rdma-core documents every verb as safe to call
// concurrently on one context); `Context` owns the pointer and has no interior state of its own.
unsafe impl Send for Context {}
// SAFETY: as above, `&Context` only calls thread-safe verbs.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name`: `ibv_get_device_list()` then `ibv_open_device()`.
    ///
    /// # Errors
    /// [`Error::NoDevice`] listing the devices that exist when none is called `name`;
    /// [`Error::Verb`] when listing or opening fails.
    #[doc(alias = "ibv_open_device")]
    pub fn open(name: &str) -> Result<Self> {
        let list = DeviceList::available()?;
        let device =
            list.find(name).ok_or_else(|| Error::NoDevice { name: Some(name.to_owned()), available: list.names() })?;
        device.open()
    }

    /// Opens the first device libibverbs lists.
    ///
    /// # Errors
    /// [`Error::NoDevice`] when there is none; [`Error::Verb`] when listing or opening fails.
    pub fn open_first() -> Result<Self> {
        let list = DeviceList::available()?;
        let device = list.get(0).ok_or(Error::NoDevice { name: None, available: Vec::new() })?;
        device.open()
    }

    pub(crate) fn from_device(device: NonNull<ffi::ibv_device>, name: &str) -> Result<Self> {
        // SAFETY: `device` is a live entry of a device list (the caller borrows it).
        let raw = unsafe { ffi::ibv_open_device(device.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last_os_error("ibv_open_device", Some(name)))?;
        // The limits are kept: requests over them are rejected by name before any verb is called.
        let attr = query_device_ex(raw, name);
        let ctx = attr.map(|ex| Context {
            raw,
            name: name.to_owned(),
            attr: ex.attr,
            capabilities: ex.capabilities,
            odp: ex.odp,
            registry: Default::default(),
        });
        let ctx = match ctx {
            Ok(ctx) => ctx,
            Err(e) => {
                // SAFETY: opened above, not yet owned by a `Context`: closed once, here.
                unsafe { ffi::ibv_close_device(raw.as_ptr()) };
                return Err(e);
            }
        };
        // Non-blocking, so that threads waiting for async events never block past a timeout.
        crate::wait::fd::set_nonblocking(ctx.async_event_fd(), "ibv_open_device", name)?;
        Ok(ctx)
    }

    /// The device's name, e.g. `rxe0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The number of physical ports; they are numbered from 1.
    pub fn port_count(&self) -> u8 {
        self.attr.phys_port_cnt
    }

    /// The device's attributes and limits as queried when it was opened.
    pub fn attr(&self) -> &DeviceAttr {
        &self.attr
    }

    /// The device's attributes and limits: `ibv_query_device()`.
    ///
    /// # Errors
    /// [`Error::Verb`] with the `errno` the verb returned.
    ///
    /// # References
    /// - [`ibv_query_device(3)`](https://man7.org/linux/man-pages/man3/ibv_query_device.3.html)
    #[doc(alias = "ibv_query_device")]
    pub fn query_device(&self) -> Result<DeviceAttr> {
        query_device(self.raw, &self.name)
    }

    /// The device's extended attributes: `ibv_query_device_ex()`. What it can do beyond the
    /// classic verbs (memory windows, atomic write, flush, on-demand paging), its clock and
    /// completion timestamps.
    ///
    /// A provider without the extended query answers with the classic attributes and every
    /// extended field zero, as libibverbs does.
    ///
    /// # Errors
    /// [`Error::Verb`] with the `errno` the verb returned.
    ///
    /// # References
    /// - [`ibv_query_device_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_query_device_ex.3.html)
    #[doc(alias = "ibv_query_device_ex")]
    pub fn query_device_ex(&self) -> Result<DeviceAttrEx> {
        query_device_ex(self.raw, &self.name)
    }

    /// What the device can do, as [`query_device_ex`](Self::query_device_ex) said when it was
    /// opened. The calls that need a capability check it here first, and return
    /// [`Error::Unsupported`] without calling a verb when it is missing.
    pub fn capabilities(&self) -> DeviceCapabilities {
        self.capabilities
    }

    /// Whether the device is Soft-RoCE (rxe: vendor id `0xFFFFFF`, `RXE_VENDOR_ID` in the
    /// kernel), whose provider's known defects some calls work around or refuse.
    pub(crate) fn is_soft_roce(&self) -> bool {
        self.attr.vendor_id == 0x00ff_ffff
    }

    /// On-demand paging, as the open's extended query said.
    pub(crate) fn odp(&self) -> OdpCapabilities {
        self.odp
    }

    /// The attributes of port `port` (numbered from 1): `ibv_query_port()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the device has no port `port`; [`Error::Verb`] when the
    /// verb fails.
    ///
    /// # References
    /// - [`ibv_query_port(3)`](https://man7.org/linux/man-pages/man3/ibv_query_port.3.html)
    #[doc(alias = "ibv_query_port")]
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.check_port("ibv_query_port", port)?;
        let mut attr = MaybeUninit::<ffi::ibv_port_attr>::zeroed();
        // SAFETY: `raw` is an open context, `port` one of its ports and `attr` a writable,
        // zeroed `ibv_port_attr` of the size the provider is told.
        let rc = unsafe { ffi::___ibv_query_port(self.raw.as_ptr(), port, attr.as_mut_ptr()) };
        Error::check("ibv_query_port", Some(&self.name), rc)?;
        // SAFETY: the verb succeeded and filled the struct.
        Ok(PortAttr::from_raw(unsafe { &attr.assume_init() }))
    }

    /// One entry of a port's GID table: `ibv_query_gid_ex()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a port the device does not have or an index past the
    /// port's table; [`Error::Verb`] with `ENODATA` when the entry is empty.
    ///
    /// # References
    /// - [`ibv_query_gid_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_query_gid_ex.3.html)
    #[doc(alias = "ibv_query_gid_ex")]
    #[doc(alias = "ibv_query_gid")]
    pub fn query_gid(&self, port: u8, index: u8) -> Result<GidEntry> {
        let table_len = self.query_port(port)?.gid_table_len;
        if u32::from(index) >= table_len {
            return Err(Error::invalid(
                "ibv_query_gid_ex",
                Some(&self.name),
                format!("GID index {index} is past port {port}'s table of {table_len} entries"),
            ));
        }
        let mut entry = MaybeUninit::<ffi::ibv_gid_entry>::zeroed();
        // SAFETY: `raw` is an open context; `entry` is a writable `ibv_gid_entry` whose size is
        // passed, as the inline `ibv_query_gid_ex` in verbs.h does.
        let rc = unsafe {
            crate::ffi_ext::_ibv_query_gid_ex(
                self.raw.as_ptr(),
                u32::from(port),
                u32::from(index),
                entry.as_mut_ptr(),
                0,
                std::mem::size_of::<ffi::ibv_gid_entry>(),
            )
        };
        Error::check("ibv_query_gid_ex", Some(&self.name), rc)?;
        // SAFETY: the verb succeeded and filled the entry.
        GidEntry::from_raw(unsafe { &entry.assume_init() })
            .ok_or_else(|| Error::invalid("ibv_query_gid_ex", Some(&self.name), "the entry names a port past 255"))
    }

    /// Every valid GID of every port: `ibv_query_gid_table()`. Empty slots are left out.
    ///
    /// # Errors
    /// [`Error::Verb`] with the `errno` the verb returned.
    ///
    /// # References
    /// - [`ibv_query_gid_table(3)`](https://man7.org/linux/man-pages/man3/ibv_query_gid_table.3.html)
    #[doc(alias = "ibv_query_gid_table")]
    pub fn gid_table(&self) -> Result<Vec<GidEntry>> {
        let mut capacity = 0usize;
        for port in 1..=self.port_count() {
            capacity += self.query_port(port)?.gid_table_len as usize;
        }
        let mut entries: Vec<ffi::ibv_gid_entry> = Vec::with_capacity(capacity);
        // SAFETY: `entries` has room for `capacity` entries of the size passed; the verb writes
        // at most `capacity` of them and returns how many.
        let n = unsafe {
            crate::ffi_ext::_ibv_query_gid_table(
                self.raw.as_ptr(),
                entries.as_mut_ptr(),
                capacity,
                0,
                std::mem::size_of::<ffi::ibv_gid_entry>(),
            )
        };
        if n < 0 {
            return Err(Error::from_errno("ibv_query_gid_table", Some(&self.name), (-n) as i32));
        }
        let n = (n as usize).min(capacity);
        // SAFETY: the verb initialised the first `n` entries, and `n <= capacity`.
        unsafe { entries.set_len(n) };
        Ok(entries.iter().filter_map(GidEntry::from_raw).collect())
    }

    fn check_port(&self, verb: &'static str, port: u8) -> Result<()> {
        if port == 0 || port > self.port_count() {
            return Err(Error::invalid(
                verb,
                Some(&self.name),
                format!("port {port} does not exist (the device has ports 1..={})", self.port_count()),
            ));
        }
        Ok(())
    }

    /// The objects of this context still alive.
    pub(crate) fn registry(&self) -> &crate::registry::Registry {
        &self.registry
    }

    pub(crate) fn check_port_arg(&self, verb: &'static str, port: u8) -> Result<()> {
        self.check_port(verb, port)
    }

    /// The raw `struct ibv_context *`, for verbs this crate does not wrap. It stays owned by
    /// `self`: do not close it.
    pub fn as_raw(&self) -> *mut ffi::ibv_context {
        self.raw.as_ptr()
    }

    /// The driver's name for the device as the kernel sees it (`ibv_device.dev_name`, e.g. `uverbs0`).
    pub fn kernel_device_name(&self) -> String {
        // SAFETY: an open context points at its device, which lives as long as the context.
        let dev = unsafe { &*(*self.raw.as_ptr()).device };
        // SAFETY: `dev_name` is a NUL-terminated string in the device struct.
        unsafe { CStr::from_ptr(dev.dev_name.as_ptr()) }.to_string_lossy().into_owned()
    }
}

fn query_device_ex(raw: NonNull<ffi::ibv_context>, name: &str) -> Result<DeviceAttrEx> {
    let mut attr = MaybeUninit::<ffi::ibv_device_attr_ex>::zeroed();
    // SAFETY: `raw` is an open context, the input is null (no extensions asked for) and `attr`
    // a writable `ibv_device_attr_ex`.
    let rc = unsafe { ffi::ibv_query_device_ex(raw.as_ptr(), std::ptr::null(), attr.as_mut_ptr()) };
    Error::check("ibv_query_device_ex", Some(name), rc)?;
    // SAFETY: the verb succeeded; the struct is plain data and was zeroed before.
    Ok(DeviceAttrEx::from_raw(unsafe { &attr.assume_init() }))
}

fn query_device(raw: NonNull<ffi::ibv_context>, name: &str) -> Result<DeviceAttr> {
    let mut attr = MaybeUninit::<ffi::ibv_device_attr>::zeroed();
    // SAFETY: `raw` is an open context and `attr` a writable `ibv_device_attr`.
    let rc = unsafe { ffi::ibv_query_device(raw.as_ptr(), attr.as_mut_ptr()) };
    Error::check("ibv_query_device", Some(name), rc)?;
    // SAFETY: the verb succeeded and filled the struct (it was zeroed before, too).
    Ok(DeviceAttr::from_raw(unsafe { &attr.assume_init() }))
}

impl Drop for Context {
    #[doc(alias = "ibv_close_device")]
    fn drop(&mut self) {
        // SAFETY: this is the context's drop: every object still registered belongs to a
        // wrapper that was forgotten or failed to destroy it (see `registry`); no live wrapper
        // can exist (they borrow the context or hold its `Arc`), so nothing will use it again.
        unsafe { self.registry.destroy_leftovers() };
        // SAFETY: `raw` was opened by `ibv_open_device` and is closed only here; every resource
        // made from it is gone (dropped, or forgotten and destroyed just above).
        // A destructor has nobody to report a failure to.
        let _ = unsafe { ffi::ibv_close_device(self.raw.as_ptr()) };
    }
}
