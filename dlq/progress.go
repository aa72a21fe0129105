package dlq

import "time"

// Progress says how far a long operation is. A Progress callback receives it at most every
// progressInterval while the operation runs, and once more at its end with Done set.
type Progress struct {
	// Op is "read" (Messages, Show, Stats, Groups, a dry run), "replay", "archive" or "purge".
	Op string `json:"op"`
	// Queue is the queue read: Q.dlq or Q.dlq.archive.
	Queue string `json:"queue"`
	// Total is the number of messages the queue held when the operation started; the
	// operation reads at most that many.
	Total int `json:"total"`
	// Scanned is how many messages were read so far, Matched how many of them the
	// selector chose, Moved how many were replayed, archived or purged (committed).
	Scanned int `json:"scanned"`
	Matched int `json:"matched"`
	Moved   int `json:"moved"`
	// Elapsed is the time since the operation started.
	Elapsed time.Duration `json:"elapsed_ns"`
	// Done is set on the last report.
	Done bool `json:"done"`
}

// progressInterval is the least time between two Progress reports of one operation.
const progressInterval = 200 * time.Millisecond

// progressor calls fn with the state of one operation, at most every progressInterval.
type progressor struct {
	fn    func(Progress)
	p     Progress
	start time.Time
	last  time.Time
}

func newProgressor(fn func(Progress), op, queue string, total int) *progressor {
	now := time.Now()
	return &progressor{fn: fn, p: Progress{Op: op, Queue: queue, Total: total}, start: now, last: now}
}

func (p *progressor) scanned(n int, matched bool) {
	p.p.Scanned += n
	if matched {
		p.p.Matched += n
	}
	p.report(false)
}

func (p *progressor) moved(n int) {
	p.p.Moved += n
	p.report(false)
}

func (p *progressor) done() { p.report(true) }

func (p *progressor) report(done bool) {
	if p.fn == nil {
		return
	}
	now := time.Now()
	if !done && now.Sub(p.last) < progressInterval {
		return
	}
	p.last = now
	p.p.Elapsed = now.Sub(p.start)
	p.p.Done = done
	p.fn(p.p)
}
