package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRecord(t *testing.T) {
	now := time.Date(2026, 12, 2, 1, 30, 0, 0, time.UTC)
	table := []byte("| benchmark | metric |\n| --- | --- |\n| X | msgs/s |\n")
	tests := []struct {
		name    string
		doc     string
		want    []string // in the result, in order
		wantErr error
	}{
		{
			name: "first run replaces the placeholder and keeps the text around it",
			doc:  "# Benchmarks\n\nintro\n\n" + recordBegin + "\nNo run recorded yet.\n" + recordEnd + "\n\nafter\n",
			want: []string{"# Benchmarks\n\nintro\n\n" + recordBegin + "\n", "Measured 2026-12-02 01:30 UTC against RabbitMQ 4.3.6", "round(s).\n\n| benchmark | metric |", "| X | msgs/s |\n" + recordEnd + "\n\nafter\n"},
		},
		{
			name: "a later run replaces the earlier table",
			doc:  recordBegin + "\nMeasured earlier\n\n| old |\n" + recordEnd + "\n",
			want: []string{recordBegin + "\n", "| X | msgs/s |\n" + recordEnd + "\n"},
		},
		{name: "no markers", doc: "# Benchmarks\n", wantErr: errNoMarkers},
		{name: "end marker before begin", doc: recordEnd + "\n" + recordBegin + "\n", wantErr: errNoMarkers},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
			require.NoError(t, os.WriteFile(path, []byte(tt.doc), 0o644))
			err := record(path, "", "RabbitMQ 4.3.6", table, 3, now)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				got, rerr := os.ReadFile(path)
				require.NoError(t, rerr)
				assert.Equal(t, tt.doc, string(got), "the file is left as it was")
				return
			}
			require.NoError(t, err)
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			rest := string(got)
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				require.GreaterOrEqual(t, i, 0, "%q not found (in order) in:\n%s", w, got)
				rest = rest[i+len(w):]
			}
			assert.NotContains(t, string(got), "old", "the earlier table is gone")
			assert.NotContains(t, string(got), "No run recorded yet")
			assert.Equal(t, 1, strings.Count(string(got), "Measured 2026"), "one heading")
		})
	}
}

func TestRecordMissingFile(t *testing.T) {
	err := record(filepath.Join(t.TempDir(), "absent.md"), "", "RabbitMQ 4.3.6", []byte("| x |"), 1, time.Now())
	require.ErrorIs(t, err, os.ErrNotExist)
}

// Each broker version has its own section: recording one leaves the other's table alone.
func TestRecordSection(t *testing.T) {
	b43, e43 := markers("RabbitMQ 4.3")
	b310, e310 := markers("RabbitMQ 3.10")
	doc := b43 + "\nNo run recorded yet.\n" + e43 + "\n" + b310 + "\nMeasured earlier against RabbitMQ 3.10.8\n\n| old 3.10 |\n" + e310 + "\n"
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
	table := []byte("| X | msgs/s |\n")
	require.NoError(t, record(path, "RabbitMQ 4.3", "RabbitMQ 4.3.6", table, 1, time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(got), b43+"\nMeasured 2026-12-04 09:00 UTC against RabbitMQ 4.3.6")
	assert.Contains(t, string(got), "| old 3.10 |", "the 3.10 table is kept")
	assert.NotContains(t, string(got), "No run recorded yet")
	err = record(path, "RabbitMQ 4.0", "RabbitMQ 4.0.9", table, 1, time.Now())
	require.ErrorIs(t, err, errNoMarkers)
	assert.Contains(t, err.Error(), "benchtable:begin RabbitMQ 4.0")
}

// make bench-record on one broker fills that version's table and, when the file has its
// markers, that version's summary at the top; the other version's are kept.
func TestRunRecordsTableAndSummary(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("needs /bin/sh")
	}
	t.Setenv("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/") // no broker: the heading says so
	sb43, se43 := markers(summarySection("RabbitMQ 4.3"))
	sb310, se310 := markers(summarySection("RabbitMQ 3.10"))
	b43, e43 := markers("RabbitMQ 4.3")
	doc := sb43 + "\n" + se43 + "\n" + sb310 + "\n| old 3.10 summary |\n" + se310 + "\n\n## Reproducing\n\n" + b43 + "\n" + e43 + "\n"
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
	script := `echo "pkg: github.com/sluice-go/sluice/router"
printf 'BenchmarkConsume/sluice-2\t10\t80 msgs/s\n'
printf 'BenchmarkConsume/raw-2\t10\t100 msgs/s\n'
printf 'BenchmarkStackInProcess/sluice-2\t10\t5 ns/op\n'`
	var out bytes.Buffer
	status := run([]string{"-record", path, "-section", "RabbitMQ 4.3", "--", "/bin/sh", "-c", script}, strings.NewReader(""), &out, &bytes.Buffer{})
	require.Equal(t, 0, status, out.String())
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	summary := string(got[strings.Index(string(got), sb43):strings.Index(string(got), se43)])
	assert.Contains(t, summary, "| consume, handler that does nothing, 8 at a time, prefetch 64 (msgs/s) | 80.00 | 100.0 |  | 0.80x |  |")
	assert.NotContains(t, summary, "StackInProcess", "only the headline rows")
	full := string(got[strings.Index(string(got), b43):strings.Index(string(got), e43)])
	assert.Contains(t, full, "StackInProcess")
	assert.Contains(t, string(got), "| old 3.10 summary |", "the 3.10 summary is kept")
	assert.Contains(t, out.String(), "summary recorded in")
}
