package poison

// MaxStackBytes is the size a record's stack is truncated to, for the package's external
// tests.
const MaxStackBytes = 16 << 10

// ErrNoDeadLetterer is Middleware's refusal of a Config without a DeadLetterer.
var ErrNoDeadLetterer = errNoDeadLetterer
