//go:build soak

package soak

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const mib = 1 << 20

// synth samples f every sampleEvery over d.
func synth(d time.Duration, f func(at time.Duration) float64) []Sample {
	var out []Sample
	for at := time.Duration(0); at <= d; at += sampleEvery {
		out = append(out, Sample{At: at, V: f(at)})
	}
	return out
}

// The detector on synthetic series, for the two run lengths the soak is run at (CI's 3
// minutes, the default 30) with the bounds the soak uses.
func TestDetector(t *testing.T) {
	rng := rand.New(rand.NewPCG(38, 5))
	noise := func(amp float64) float64 { return (rng.Float64()*2 - 1) * amp }
	mem, gor, conns, chans := bounds[seriesRSS], bounds[seriesGoroutines], bounds[seriesConnections], bounds[seriesChannels]
	perMinute := func(at time.Duration) float64 { return at.Minutes() }

	cases := []struct {
		name  string
		d     time.Duration
		bound Bound
		f     func(at time.Duration) float64
		leak  bool
	}{
		{"memory flat with noise, 3m", 3 * time.Minute, mem, func(time.Duration) float64 { return 40*mib + noise(3*mib) }, false},
		{"memory flat with noise, 30m", 30 * time.Minute, mem, func(time.Duration) float64 { return 40*mib + noise(3*mib) }, false},
		{"memory fills a bounded cache in the warm-up, then flat", 30 * time.Minute, mem, func(at time.Duration) float64 {
			return 40*mib + 20*mib*math.Min(1, at.Minutes()/4) + noise(2*mib)
		}, false},
		// The Go heap between collections: it climbs to the GC goal and falls, a period
		// that does not divide the sampling interval.
		{"heap GC sawtooth, 3m", 3 * time.Minute, mem, func(at time.Duration) float64 {
			return 30*mib + 20*mib*math.Mod(at.Seconds(), 47)/47
		}, false},
		{"heap GC sawtooth, 30m", 30 * time.Minute, mem, func(at time.Duration) float64 {
			return 30*mib + 20*mib*math.Mod(at.Seconds(), 47)/47
		}, false},
		// The gateway's ledger: 20,000 → 40,000 charges over 200 s at 100/s, then cut back.
		{"ledger sawtooth with a long period, 30m", 30 * time.Minute, mem, func(at time.Duration) float64 {
			return 40*mib + 5*mib*math.Mod(at.Seconds(), 200)/200 + noise(mib)
		}, false},
		{"one late spike", 30 * time.Minute, mem, func(at time.Duration) float64 {
			if at >= 29*time.Minute+50*time.Second {
				return 80 * mib
			}
			return 40*mib + noise(mib)
		}, false},
		// A leaked message (2 KiB) per payment at 100/s: 11.7 MiB a minute.
		{"message leak at 100/s, 3m", 3 * time.Minute, mem, func(at time.Duration) float64 {
			return 40*mib + 2048*100*at.Seconds() + noise(3*mib)
		}, true},
		// Ten times slower (200 B a payment) is caught by the long run only.
		{"slow leak, 30m", 30 * time.Minute, mem, func(at time.Duration) float64 {
			return 40*mib + 200*100*at.Seconds() + noise(3*mib)
		}, true},
		{"slow leak, 3m: below what 2 minutes can tell", 3 * time.Minute, mem, func(at time.Duration) float64 {
			return 40*mib + 200*100*at.Seconds() + noise(3*mib)
		}, false},
		{"goroutines vary with the load", 30 * time.Minute, gor, func(time.Duration) float64 { return 60 + math.Round(noise(12)) }, false},
		{"a goroutine leaked every 5 s", 30 * time.Minute, gor, func(at time.Duration) float64 {
			return 60 + math.Floor(at.Seconds()/5) + math.Round(noise(12))
		}, true},
		{"a goroutine leaked every second, 3m", 3 * time.Minute, gor, func(at time.Duration) float64 {
			return 60 + at.Seconds() + math.Round(noise(12))
		}, true},
		{"connections steady", 30 * time.Minute, conns, func(time.Duration) float64 { return 3 }, false},
		{"a connection blip (a reconnect)", 30 * time.Minute, conns, func(at time.Duration) float64 {
			if at > 15*time.Minute && at < 16*time.Minute {
				return 4
			}
			return 3
		}, false},
		{"one connection more from mid-run", 30 * time.Minute, conns, func(at time.Duration) float64 {
			if at > 15*time.Minute {
				return 4
			}
			return 3
		}, true},
		{"a connection a minute, 3m", 3 * time.Minute, conns, func(at time.Duration) float64 { return 3 + math.Floor(perMinute(at)) }, true},
		{"channels steady with a transient one", 30 * time.Minute, chans, func(time.Duration) float64 {
			return 12 + math.Round(rng.Float64()*0.6)
		}, false},
		{"a channel leaked a minute", 30 * time.Minute, chans, func(at time.Duration) float64 { return 12 + math.Floor(perMinute(at)) }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			samples := synth(c.d, c.f)
			v := Judge(samples, warmupOf(c.d), c.bound)
			require.GreaterOrEqual(t, v.Judged, minJudged, v.Reason)
			assert.Equal(t, c.leak, v.Leak, "%s (growth %.4g, allowed %.4g, persistent %v)", v.Reason, v.Growth, v.Allowed, v.Persistent)
		})
	}
}

func TestDetectorTooFewSamples(t *testing.T) {
	samples := synth(time.Minute+30*time.Second, func(at time.Duration) float64 { return at.Seconds() * mib })
	v := Judge(samples, time.Minute, bounds[seriesRSS])
	assert.False(t, v.Leak, "a verdict from 4 samples")
	assert.Contains(t, v.Reason, "not judged")
	assert.Equal(t, 0.0, v.Start)
	assert.Equal(t, 90.0*mib, v.Peak)
	assert.Equal(t, 90.0*mib, v.End)
}

func TestSpliceSection(t *testing.T) {
	section := "## Soak\n\nnew table\n"
	t.Run("replaces the section and keeps the rest byte for byte", func(t *testing.T) {
		doc := "# B\n\n## A\n\na\n\n## Soak\n\nold\n### sub\n\nold too\n\n## Latest generated tables\n\nx\n"
		got := string(spliceSection([]byte(doc), section))
		assert.Equal(t, "# B\n\n## A\n\na\n\n## Soak\n\nnew table\n\n## Latest generated tables\n\nx\n", got)
	})
	t.Run("a section at the end", func(t *testing.T) {
		got := string(spliceSection([]byte("# B\n\n## Soak\n\nold\n"), section))
		assert.Equal(t, "# B\n\n"+section, got)
	})
	t.Run("absent: before the generated tables", func(t *testing.T) {
		doc := "# B\n\n## Soaking tips\n\n## Latest generated tables\n\nx\n"
		got := string(spliceSection([]byte(doc), section))
		assert.Equal(t, "# B\n\n## Soaking tips\n\n"+section+"\n## Latest generated tables\n\nx\n", got)
	})
	t.Run("absent, no generated tables: at the end", func(t *testing.T) {
		got := string(spliceSection([]byte("# B\n\ntext\n\n"), section))
		assert.Equal(t, "# B\n\ntext\n\n"+section, got)
	})
	t.Run("idempotent", func(t *testing.T) {
		doc := []byte("# B\n\n## Soak\n\nold\n\n## Latest generated tables\n\nx\n")
		once := spliceSection(doc, section)
		assert.Equal(t, string(once), string(spliceSection(once, section)))
	})
}

func TestMetricSum(t *testing.T) {
	text := strings.Join([]string{
		"# HELP go_goroutines Number of goroutines that currently exist.",
		"go_goroutines 42",
		"go_goroutines_other 7",
		`sluice_idempotency_hits_total{handler="payments",queue="q"} 3`,
		`sluice_idempotency_hits_total{handler="other",queue="q"} 2`,
		"go_memstats_heap_inuse_bytes 1.2345e+07",
	}, "\n")
	v, ok := metricSum(text, "go_goroutines")
	assert.True(t, ok)
	assert.Equal(t, 42.0, v)
	v, ok = metricSum(text, "sluice_idempotency_hits_total")
	assert.True(t, ok)
	assert.Equal(t, 5.0, v)
	v, _ = metricSum(text, "go_memstats_heap_inuse_bytes")
	assert.Equal(t, 1.2345e7, v)
	_, ok = metricSum(text, "go_threads")
	assert.False(t, ok)
}

func TestHexPort(t *testing.T) {
	assert.Equal(t, 5672, hexPort("0100007F:1628"))
	assert.Equal(t, 5672, hexPort("00000000000000000000000001000000:1628"))
	assert.Equal(t, -1, hexPort("junk"))
}

func TestSoakSection(t *testing.T) {
	section := soakSection("3m at 100 requests/s", "100 requests sent", "| metric |\n")
	require.True(t, strings.HasPrefix(section, soakHeading+"\n"))
	assert.NotContains(t, section, "¦")
	assert.Contains(t, section, "Measured: 3m at 100 requests/s\n100 requests sent.\n\n| metric |\n")
	doc := []byte("# B\n\n## Soak\n\nold\n\n## Latest generated tables\n\nx\n")
	once := spliceSection(doc, section)
	assert.Equal(t, string(once), string(spliceSection(once, section)), "recording twice changes nothing more")
	assert.True(t, strings.HasSuffix(string(once), "| metric |\n\n## Latest generated tables\n\nx\n"))
}
