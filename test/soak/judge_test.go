//go:build soak

package soak

import (
	"fmt"
	"math"
	"time"
)

// sampleEvery is how often the service is sampled.
const sampleEvery = 10 * time.Second

// Sample is one reading of a series, taken At after the soak started.
type Sample struct {
	At time.Duration
	V  float64
}

// Bound is how much a series may grow across the judged window (the samples after the
// warm-up) before the soak calls it a leak: Abs units plus Rel times the series' level at
// the window's start. The allowance is for the whole window, not per hour: a run 10 times
// longer tolerates the same growth, so its sensitivity to a slow leak is 10 times finer.
type Bound struct {
	// Rel is the allowed growth as a fraction of the level (0.10: 10%).
	Rel float64
	// Abs is the allowed growth in the series' unit, above Rel; it keeps small counts
	// (connections, channels) and small heaps from failing on one step of noise.
	Abs float64
}

// Allowance returns the growth b allows a series at level.
func (b Bound) Allowance(level float64) float64 { return b.Abs + b.Rel*math.Abs(level) }

// Verdict is what Judge concluded about one series.
type Verdict struct {
	// Start, Peak and End are the first, highest and last readings of the whole run
	// (warm-up included), for the table.
	Start, Peak, End float64
	// Level is the fitted value at the start of the judged window; Growth the fitted
	// growth across it (slope times the window's length); Allowed what the bound allows.
	Level, Growth, Allowed float64
	// Persistent is true when the last third of the window sits above its first third by
	// more than half the allowance: the growth did not fall back.
	Persistent bool
	// Judged is the number of samples after the warm-up.
	Judged int
	// Leak is true when the series kept growing beyond its bound.
	Leak bool
	// Reason says why, in words, for the failure message and the table.
	Reason string
}

// minJudged is the fewest samples after the warm-up a verdict is drawn from: below it a
// fitted slope says more about noise than about a trend.
const minJudged = 6

// Judge fits the samples after warmup and reports a leak when both hold:
//
//   - the least-squares line through them rises by more than bound allows across the
//     window, so the trend is growth and not a sawtooth (a GC cycle, a bounded cache that
//     fills and empties), whose fitted slope is near zero;
//   - the mean of the window's last third exceeds the mean of its first third by more than
//     half the allowance, so the growth persisted to the end rather than being a late
//     spike or an early dip that tilts the line.
//
// With fewer than minJudged samples after the warm-up it draws no conclusion and says so:
// a run that short cannot tell a leak from noise, and pretending otherwise would make the
// soak flaky.
func Judge(samples []Sample, warmup time.Duration, bound Bound) Verdict {
	var v Verdict
	if len(samples) == 0 {
		v.Reason = "no samples"
		return v
	}
	v.Start, v.End, v.Peak = samples[0].V, samples[len(samples)-1].V, samples[0].V
	var judged []Sample
	for _, s := range samples {
		v.Peak = math.Max(v.Peak, s.V)
		if s.At >= warmup {
			judged = append(judged, s)
		}
	}
	v.Judged = len(judged)
	if len(judged) < minJudged {
		v.Reason = fmt.Sprintf("only %d samples after the %s warm-up, want at least %d: not judged", len(judged), warmup, minJudged)
		return v
	}
	slope, intercept := fit(judged)
	t0, t1 := judged[0].At.Seconds(), judged[len(judged)-1].At.Seconds()
	v.Level = intercept + slope*t0
	v.Growth = slope * (t1 - t0)
	v.Allowed = bound.Allowance(v.Level)
	third := len(judged) / 3
	first, last := mean(judged[:third]), mean(judged[len(judged)-third:])
	v.Persistent = last-first > v.Allowed/2
	v.Leak = v.Growth > v.Allowed && v.Persistent
	switch {
	case v.Leak:
		v.Reason = fmt.Sprintf("grew %.4g across the %s after the warm-up (fitted), more than the %.4g allowed, and kept it (last third %.4g above the first)",
			v.Growth, time.Duration((t1-t0)*float64(time.Second)).Round(time.Second), v.Allowed, last-first)
	case v.Growth > v.Allowed:
		v.Reason = fmt.Sprintf("fitted growth %.4g above the %.4g allowed but not persistent (last third %.4g above the first): not a leak", v.Growth, v.Allowed, last-first)
	default:
		v.Reason = fmt.Sprintf("fitted growth %.4g within the %.4g allowed", v.Growth, v.Allowed)
	}
	return v
}

// fit returns the least-squares line through samples, time in seconds.
func fit(samples []Sample) (slope, intercept float64) {
	n := float64(len(samples))
	var sx, sy, sxx, sxy float64
	for _, s := range samples {
		x := s.At.Seconds()
		sx += x
		sy += s.V
		sxx += x * x
		sxy += x * s.V
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return 0, sy / n
	}
	slope = (n*sxy - sx*sy) / den
	return slope, (sy - slope*sx) / n
}

func mean(samples []Sample) float64 {
	if len(samples) == 0 {
		return 0
	}
	var s float64
	for _, x := range samples {
		s += x.V
	}
	return s / float64(len(samples))
}
