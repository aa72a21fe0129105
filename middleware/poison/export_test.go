package poison

// Aliases for the package's external tests.
const MaxStackBytes = maxStackBytes
