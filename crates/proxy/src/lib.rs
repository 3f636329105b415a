//! The standalone HTTP gateway embedding the scheduler.
