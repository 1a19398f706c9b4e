//! Placeholder: the copy-bandwidth ceiling.
