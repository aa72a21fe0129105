package sluice_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mayReadEnvironment are the folders whose code may read environment variables: the
// programs (cmd/, examples/), the test and benchmark tooling, and telemetry/otelsetup,
// which an application imports to set up the OpenTelemetry SDK and which honours the SDK's
// own OTEL_* variables as the OpenTelemetry specification asks.
var mayReadEnvironment = []string{
	"cmd/", "examples/", "test/", "tools/",
	"internal/testkit/testenv/", "internal/benchkit/benchenv/", "internal/benchkit/benchtable/", "internal/benchkit/delaybench/",
	"internal/testkit/testsummary/", "internal/testkit/dlqfill/",
	"telemetry/otelsetup/",
}

// Issue 35: router.Connect and amqp.Config read AMQP_URL, and amqp fell back to a guest
// URL on localhost. A library takes its configuration from its caller; no package outside
// the folders above calls os.Getenv, os.LookupEnv or os.Environ.
func TestLibraryReadsNoEnvironment(t *testing.T) {
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	root := filepath.Dir(file)
	var readers []string
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			for _, allowed := range mayReadEnvironment {
				if rel+"/" == allowed {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "os" && (sel.Sel.Name == "Getenv" || sel.Sel.Name == "LookupEnv" || sel.Sel.Name == "Environ") {
				readers = append(readers, rel+": os."+sel.Sel.Name)
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	assert.Greater(t, checked, 50, "the library's files were read")
	assert.Empty(t, readers, "library code reading the environment")
}
