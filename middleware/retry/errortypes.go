package retry

import "github.com/sluice-go/sluice"

// A message deferred too long is dead-lettered as such, whatever deferred it.
func init() { sluice.RegisterErrorType(ErrDeferralExpired, "deferral_expired") }
