//! Model-server emulator and discrete-event fleet simulator.
