package retry

import (
	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/disposition"
)

// A message deferred too long is dead-lettered as such, whatever deferred it.
func init() { sluice.RegisterErrorType(disposition.ErrDeferralExpired, "deferral_expired") }
