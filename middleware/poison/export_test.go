package poison

// MaxStackBytes is the size a record's stack is truncated to, for the package's external
// tests.
const MaxStackBytes = 16 << 10
