//! OpenAI wire types shared by the body-based router, the picker, the proxy and the emulator.
