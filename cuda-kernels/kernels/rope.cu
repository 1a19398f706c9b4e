// Placeholder: written with its CPU twin.
