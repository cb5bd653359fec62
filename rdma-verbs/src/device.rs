//! Listing the RDMA devices of this host.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::ffi;

use crate::context::Context;
use crate::error::{Error, Result};

/// The RDMA devices of this host, as listed by `ibv_get_device_list`.
///
/// Devices borrow the list; a [`Context`] opened from one does not, so the list can be dropped as
/// soon as the devices wanted are open.
///
/// # References
/// - [`ibv_get_device_list(3)`](https://man7.org/linux/man-pages/man3/ibv_get_device_list.3.html)
#[doc(alias = "ibv_get_device_list")]
#[derive(Debug)]
pub struct DeviceList {
    /// The array from `ibv_get_device_list`; `None` when it returned NULL (no devices).
    list: Option<NonNull<*mut ffi::ibv_device>>,
    len: usize,
}

impl DeviceList {
    /// Lists the RDMA devices: `ibv_get_device_list()`.
    ///
    /// A kernel without RDMA support (`ENOSYS`) gives an empty list, not an error: to a program
    /// looking for a device, both mean there is none.
    ///
    /// # Errors
    /// [`Error::Verb`] with `EPERM` or `ENOMEM` when libibverbs cannot read the device list.
    pub fn available() -> Result<Self> {
        let mut len: libc::c_int = 0;
        // SAFETY: `len` is a valid out-pointer; the call has no other preconditions.
        let list = unsafe { ffi::ibv_get_device_list(&mut len) };
        match NonNull::new(list) {
            Some(list) => Ok(DeviceList { list: Some(list), len: usize::try_from(len).unwrap_or(0) }),
            None => {
                // libibverbs returns NULL both for failures and, in some versions, for "no
                // devices": freeing that NULL would crash, so it is never kept.
                let err = Error::last_os_error("ibv_get_device_list", None);
                match err.errno() {
                    Some(libc::ENOSYS) | Some(0) => Ok(DeviceList { list: None, len: 0 }),
                    _ if len == 0 => Ok(DeviceList { list: None, len: 0 }),
                    _ => Err(err),
                }
            }
        }
    }

    /// The number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no device at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device at `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<Device<'_>> {
        if index >= self.len {
            return None;
        }
        let list = self.list?;
        // SAFETY: the array holds `len` non-NULL device pointers, valid until it is freed in
        // `drop`; the returned `Device` borrows `self`, so it cannot outlive the array.
        let raw = unsafe { *list.as_ptr().add(index) };
        NonNull::new(raw).map(|raw| Device { raw, _list: PhantomData })
    }

    /// The devices, in the order libibverbs lists them.
    pub fn iter(&self) -> impl Iterator<Item = Device<'_>> + '_ {
        (0..self.len).filter_map(move |i| self.get(i))
    }

    /// The device called `name`, if there is one.
    pub fn find(&self, name: &str) -> Option<Device<'_>> {
        self.iter().find(|d| d.name() == name)
    }

    /// The names of all devices.
    pub fn names(&self) -> Vec<String> {
        self.iter().map(|d| d.name().to_owned()).collect()
    }
}

impl Drop for DeviceList {
    #[doc(alias = "ibv_free_device_list")]
    fn drop(&mut self) {
        if let Some(list) = self.list {
            // SAFETY: `list` came from `ibv_get_device_list`, is non-NULL and is freed only here.
            // Contexts opened from its devices stay valid (ibv_get_device_list(3)).
            unsafe { ffi::ibv_free_device_list(list.as_ptr()) };
        }
    }
}

/// One RDMA device of a [`DeviceList`].
///
/// # References
/// - [`ibv_get_device_name(3)`](https://man7.org/linux/man-pages/man3/ibv_get_device_name.3.html)
#[derive(Debug, Clone, Copy)]
pub struct Device<'list> {
    raw: NonNull<ffi::ibv_device>,
    _list: PhantomData<&'list DeviceList>,
}

/// What kind of node a device is (`enum ibv_node_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeType {
    /// An InfiniBand channel adapter, or a RoCE NIC such as rxe (`IBV_NODE_CA`).
    ChannelAdapter,
    /// A switch (`IBV_NODE_SWITCH`).
    Switch,
    /// A router (`IBV_NODE_ROUTER`).
    Router,
    /// An iWARP NIC (`IBV_NODE_RNIC`).
    Rnic,
    /// Any other value libibverbs reported.
    Other(i32),
}

impl<'list> Device<'list> {
    /// The kernel's name for the device, e.g. `rxe0` or `mlx5_0`: `ibv_get_device_name()`.
    #[doc(alias = "ibv_get_device_name")]
    pub fn name(&self) -> &'list str {
        // SAFETY: the device is valid while the list is (the `'list` borrow); the name is a
        // NUL-terminated string inside it.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(self.raw.as_ptr())) };
        name.to_str().unwrap_or("<non-UTF-8 device name>")
    }

    /// The device's node GUID, in host byte order: `ibv_get_device_guid()`.
    #[doc(alias = "ibv_get_device_guid")]
    pub fn guid(&self) -> u64 {
        // SAFETY: the device is valid while the list is.
        u64::from_be(unsafe { ffi::ibv_get_device_guid(self.raw.as_ptr()) })
    }

    /// The kind of node the device is.
    pub fn node_type(&self) -> NodeType {
        // SAFETY: the device is valid while the list is; `node_type` is a plain field.
        let t = unsafe { (*self.raw.as_ptr()).node_type };
        match t {
            ffi::ibv_node_type::IBV_NODE_CA => NodeType::ChannelAdapter,
            ffi::ibv_node_type::IBV_NODE_SWITCH => NodeType::Switch,
            ffi::ibv_node_type::IBV_NODE_ROUTER => NodeType::Router,
            ffi::ibv_node_type::IBV_NODE_RNIC => NodeType::Rnic,
            other => NodeType::Other(other),
        }
    }

    /// Opens the device: `ibv_open_device()`. The context outlives this list.
    ///
    /// # Errors
    /// [`Error::Verb`] naming the device, with the `errno` `ibv_open_device` set.
    ///
    /// # References
    /// - [`ibv_open_device(3)`](https://man7.org/linux/man-pages/man3/ibv_open_device.3.html)
    #[doc(alias = "ibv_open_device")]
    pub fn open(&self) -> Result<Context> {
        Context::from_device(self.raw, self.name())
    }

    /// The raw `struct ibv_device *`, valid while the list is.
    pub fn as_raw(&self) -> *mut ffi::ibv_device {
        self.raw.as_ptr()
    }
}
