package pausegate_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice/internal/pausegate"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestGate: a change closes the previous state's channel; setting the same state does not.
func TestGate(t *testing.T) {
	var g pausegate.Gate
	st := g.State()
	assert.False(t, st.Paused)
	assert.True(t, st.Admits(5), "consuming without a limit admits every worker")

	g.Set(false, 0)
	assert.False(t, closed(st.Changed), "the same state is no change")

	g.Set(true, 0)
	assert.True(t, closed(st.Changed))
	paused := g.State()
	assert.True(t, paused.Paused)
	assert.False(t, paused.Admits(0))

	g.Set(false, 2)
	assert.True(t, closed(paused.Changed))
	probing := g.State()
	assert.True(t, probing.Admits(1))
	assert.False(t, probing.Admits(2), "only the first limit workers")

	g.Set(false, -1)
	assert.Equal(t, 0, g.State().Limit, "a negative limit is no limit")
}
