package retry_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/failure"
	"github.com/sluice-go/sluice/internal/headers"
)

// A message deferred past MaxTotalAge is dead-lettered as "deferral_expired", not as its
// last deferral's reason.
func TestMiddleware_DeferralExpiredHasItsOwnType(t *testing.T) {
	cfg := testPolicy()
	cfg.MaxTotalAge = time.Minute
	r, _, _ := newStep(t, cfg, nil)
	md := map[string]string{headers.FirstDeferTime: failure.FormatTime(now.Add(-time.Hour))}
	res := run(t, r.Middleware, failing(sluice.Defer(time.Second, errBoom)), md)
	require.NoError(t, res.err)
	require.Error(t, res.dead)
	assert.Equal(t, sluice.ClassPermanent, sluice.ClassOf(res.dead))
	assert.Equal(t, "deferral_expired", sluice.ErrorType(res.dead))
}
