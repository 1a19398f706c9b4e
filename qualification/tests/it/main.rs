//! Integration tests of the suite itself: the case list, and the proof that it catches a
//! broken daemon (a proxy that drops `data: [DONE]` makes exactly the [DONE] cases fail).
//!
//! They run the real `inferloopd` (`$INFERLOOPD`, default `target/release/inferloopd`) on the
//! real model (`$INFERLOOP_TEST_MODEL`, default `models/SmolLM2-135M-Instruct.Q4_1.gguf`).

mod broken;
mod cli;
mod proxy;
mod tls;
