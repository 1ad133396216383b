//! The control plane: how the outside world inspects and steers running VMs.
//!
//! Nothing lives here yet; the control ABI and the monitor are added as
//! `control::abi` and `control::monitor`.
