package sluice_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	// envName is what an environment variable's name looks like.
	envName = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	// backquotedEnv is a variable named in a table cell: `NAME`.
	backquotedEnv = regexp.MustCompile("`([A-Z][A-Z0-9_]*)`")
)

// Issue 56: the table of cmd/payments' variables in docs/getting-started.md missed
// RETRY_LEARNED and RETRY_STATS_WINDOW, which the service reads. The table and the code
// agree both ways: every variable cmd/payments reads has a row, and every row names a
// variable that cmd/payments reads, itself or through telemetry/otelsetup (the OTEL_*
// variables of the OpenTelemetry SDK).
func TestDocsEnvironmentTableMatchesPayments(t *testing.T) {
	documented := paymentsEnvTable(t)
	read := envReads(t, "cmd/payments")
	require.Contains(t, read, "AMQP_URL", "the code's reads were found")
	throughSetup := envReads(t, "telemetry/otelsetup")
	require.Contains(t, throughSetup, "OTEL_EXPORTER_OTLP_ENDPOINT", "otelsetup's reads were found")

	for _, name := range sortedKeys(read) {
		assert.True(t, documented[name], "cmd/payments reads %s (%s), but docs/getting-started.md's table of its variables has no row for it",
			name, strings.Join(read[name], ", "))
	}
	for _, name := range sortedKeys(documented) {
		_, own := read[name]
		_, setup := throughSetup[name]
		assert.True(t, own || setup, "docs/getting-started.md documents %s, which neither cmd/payments nor telemetry/otelsetup reads", name)
	}
}

// paymentsEnvTable returns the variables named in the first column of the table under
// "The payment example" in docs/getting-started.md.
func paymentsEnvTable(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("docs/getting-started.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(b), "\n## The payment example\n")
	require.True(t, ok, "docs/getting-started.md has a section \"The payment example\"")
	section, _, _ = strings.Cut(section, "\n## ")
	names := map[string]bool{}
	inTable := false
	for _, line := range strings.Split(section, "\n") {
		switch {
		case strings.HasPrefix(line, "| variable |"):
			inTable = true
		case inTable && strings.HasPrefix(line, "| ---"):
		case inTable && strings.HasPrefix(line, "|"):
			first := strings.Split(line, "|")[1]
			for _, m := range backquotedEnv.FindAllStringSubmatch(first, -1) {
				names[m[1]] = true
			}
		case inTable:
			inTable = false
		}
	}
	require.NotEmpty(t, names, "the table of variables was found")
	return names
}

// envReads returns the environment variables the non-test Go files of the package in dir
// read, each with where: the string constants passed to os.Getenv or os.LookupEnv, or to a
// function of the package that hands that parameter on to one of them (directly, or one
// by one when it ranges over it), whether written in the call, ranged over from a list
// literal, or held by a package-level list.
func envReads(t *testing.T, dir string) map[string][]string {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	var files []*ast.File
	lists := map[string][]string{} // package-level var or const → its string constants
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		require.NoError(t, err)
		files = append(files, f)
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, spec := range gd.Specs {
				vs, ok := spec.(*ast.ValueSpec)
				if !ok {
					continue
				}
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						lists[n.Name] = stringConstants(vs.Values[i])
					}
				}
			}
		}
	}
	require.NotEmpty(t, files, "Go files in %s", dir)

	// readers maps a function of the package to its parameter that names a variable.
	readers := map[string]param{}
	keyArg := func(call *ast.CallExpr) (param, bool) {
		switch fn := call.Fun.(type) {
		case *ast.SelectorExpr:
			if x, ok := fn.X.(*ast.Ident); ok && x.Name == "os" && (fn.Sel.Name == "Getenv" || fn.Sel.Name == "LookupEnv") {
				return param{}, true
			}
		case *ast.Ident:
			p, ok := readers[fn.Name]
			return p, ok
		}
		return param{}, false
	}
	for changed := true; changed; {
		changed = false
		for _, f := range files {
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil || fd.Recv != nil {
					continue
				}
				if _, known := readers[fd.Name.Name]; known {
					continue
				}
				params := paramIndexes(fd.Type)
				ranged := map[string]string{} // loop variable → the parameter it ranges over
				ast.Inspect(fd.Body, func(n ast.Node) bool {
					if rs, ok := n.(*ast.RangeStmt); ok {
						if x, ok := rs.X.(*ast.Ident); ok && rs.Value != nil {
							if v, ok := rs.Value.(*ast.Ident); ok {
								ranged[v.Name] = x.Name
							}
						}
					}
					call, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}
					key, ok := keyArg(call)
					if !ok || key.index >= len(call.Args) {
						return true
					}
					arg, ok := call.Args[key.index].(*ast.Ident)
					if !ok {
						return true
					}
					name := arg.Name
					if p, ok := ranged[name]; ok {
						name = p
					}
					if p, ok := params[name]; ok {
						readers[fd.Name.Name] = p
						changed = true
					}
					return true
				})
			}
		}
	}

	reads := map[string][]string{}
	add := func(name string, pos token.Pos) {
		if envName.MatchString(name) {
			p := fset.Position(pos)
			reads[name] = append(reads[name], filepath.Base(p.Filename)+":"+strconv.Itoa(p.Line))
		}
	}
	for _, f := range files {
		rangedLists := map[string][]string{} // loop variable → the constants it ranges over
		ast.Inspect(f, func(n ast.Node) bool {
			if rs, ok := n.(*ast.RangeStmt); ok {
				if v, ok := rs.Value.(*ast.Ident); ok {
					rangedLists[v.Name] = stringConstants(rs.X)
					if x, ok := rs.X.(*ast.Ident); ok {
						rangedLists[v.Name] = lists[x.Name]
					}
				}
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			key, ok := keyArg(call)
			if !ok || key.index >= len(call.Args) {
				return true
			}
			names := call.Args[key.index : key.index+1]
			if key.variadic {
				names = call.Args[key.index:]
			}
			for _, arg := range names {
				switch a := arg.(type) {
				case *ast.BasicLit:
					if s, err := strconv.Unquote(a.Value); err == nil {
						add(s, a.Pos())
					}
				case *ast.Ident:
					for _, s := range append(rangedLists[a.Name], lists[a.Name]...) {
						add(s, a.Pos())
					}
				}
			}
			return true
		})
	}
	return reads
}

// param is a function's parameter: its index, and whether it is variadic.
type param struct {
	index    int
	variadic bool
}

// paramIndexes maps the parameter names of a function to what they are.
func paramIndexes(ft *ast.FuncType) map[string]param {
	out := map[string]param{}
	i := 0
	for _, field := range ft.Params.List {
		_, variadic := field.Type.(*ast.Ellipsis)
		for _, n := range field.Names {
			out[n.Name] = param{index: i, variadic: variadic}
			i++
		}
	}
	return out
}

// stringConstants returns the string literals of a list literal ([]string{"A", "B"}), or
// of a single literal.
func stringConstants(e ast.Expr) []string {
	var out []string
	switch v := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(v.Value); err == nil {
			out = append(out, s)
		}
	case *ast.CompositeLit:
		for _, elt := range v.Elts {
			out = append(out, stringConstants(elt)...)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
