package deploy_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice/handlers/example_payment"
)

// kubeDoc is the part of a Kubernetes or KEDA object in deploy/keda the checks read.
type kubeDoc struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		// Deployment, and ScaledJob's jobTargetRef.
		Template  podTemplate `yaml:"template"`
		JobTarget struct {
			Template podTemplate `yaml:"template"`
		} `yaml:"jobTargetRef"`
		// ScaledObject.
		ScaleTarget struct {
			Name string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		MinReplicas *int `yaml:"minReplicaCount"`
		// ScaledObject and ScaledJob.
		PollingInterval int `yaml:"pollingInterval"`
		Triggers        []struct {
			Type     string            `yaml:"type"`
			Metadata map[string]string `yaml:"metadata"`
			AuthRef  struct {
				Name string `yaml:"name"`
			} `yaml:"authenticationRef"`
		} `yaml:"triggers"`
		// TriggerAuthentication.
		SecretTargetRef []struct {
			Parameter, Name, Key string
		} `yaml:"secretTargetRef"`
	} `yaml:"spec"`
}

type podTemplate struct {
	Spec struct {
		RestartPolicy string `yaml:"restartPolicy"`
		Containers    []struct {
			Name string   `yaml:"name"`
			Args []string `yaml:"args"`
			Env  []struct {
				Name  string `yaml:"name"`
				Value string `yaml:"value"`
			} `yaml:"env"`
		} `yaml:"containers"`
	} `yaml:"spec"`
}

// env returns the payments container's variables with a literal value.
func (p podTemplate) env(t *testing.T) map[string]string {
	t.Helper()
	require.Len(t, p.Spec.Containers, 1, "one container")
	c := p.Spec.Containers[0]
	assert.Equal(t, []string{"serve"}, c.Args, "the container runs payments serve")
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

// loadKube returns the objects of a deploy/keda file, by kind.
func loadKube(t *testing.T, rel string) map[string]kubeDoc {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(read(t, rel)))
	docs := map[string]kubeDoc{}
	for {
		var d kubeDoc
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs
		}
		require.NoError(t, err, "%s parses", rel)
		require.NotContains(t, docs, d.Kind, "%s holds one %s", rel, d.Kind)
		docs[d.Kind] = d
	}
}

// Issue 54, point 5: deploy/keda scales the payment service to zero on the length of the
// queue it consumes, counted as test/scaletozero_test.go counts it (over AMQP, a passive
// declare: ready messages; one instance as soon as one waits). The Jobs exit when idle
// (PAYMENTS_STOP_WHEN_IDLE, a duration payments serve accepts); the Deployment's pods must
// not (a Deployment restarts a pod that exits), KEDA scales it to zero instead.
func TestKEDAScalesThePaymentsQueueToZero(t *testing.T) {
	auth := loadKube(t, "deploy/keda/trigger-auth.yaml")["TriggerAuthentication"]
	require.Equal(t, "keda.sh/v1alpha1", auth.APIVersion)
	require.Len(t, auth.Spec.SecretTargetRef, 1)
	assert.Equal(t, "host", auth.Spec.SecretTargetRef[0].Parameter, "the AMQP URL is the scaler's host")

	job := loadKube(t, "deploy/keda/scaledjob.yaml")
	object := loadKube(t, "deploy/keda/scaledobject.yaml")
	for _, tc := range []struct {
		name string
		doc  kubeDoc
	}{
		{"ScaledJob", job["ScaledJob"]},
		{"ScaledObject", object["ScaledObject"]},
	} {
		t.Run(tc.name+" counts the queue the service consumes", func(t *testing.T) {
			require.Equal(t, "keda.sh/v1alpha1", tc.doc.APIVersion, "%s is in deploy/keda", tc.name)
			require.Len(t, tc.doc.Spec.Triggers, 1)
			tr := tc.doc.Spec.Triggers[0]
			assert.Equal(t, "rabbitmq", tr.Type)
			assert.Equal(t, map[string]string{
				"protocol": "amqp", "queueName": example_payment.QueueRequested,
				"mode": "QueueLength", "value": "1", "activationValue": "0",
			}, tr.Metadata)
			assert.Equal(t, auth.Metadata.Name, tr.AuthRef.Name, "the trigger authenticates with trigger-auth.yaml's")
			assert.Positive(t, tc.doc.Spec.PollingInterval, "the polling interval is set (docs/scaling.md counts with it)")
		})
	}
	t.Run("the Jobs exit when idle", func(t *testing.T) {
		tpl := job["ScaledJob"].Spec.JobTarget.Template
		assert.Equal(t, "Never", tpl.Spec.RestartPolicy)
		env := tpl.env(t)
		d, err := time.ParseDuration(env["PAYMENTS_STOP_WHEN_IDLE"])
		require.NoError(t, err, "PAYMENTS_STOP_WHEN_IDLE is a duration")
		assert.Positive(t, d)
		assert.Equal(t, example_payment.QueueRequested, env["PAYMENTS_QUEUE"])
	})
	t.Run("the Deployment runs until KEDA scales it to zero", func(t *testing.T) {
		obj, dep := object["ScaledObject"], object["Deployment"]
		require.Equal(t, "apps/v1", dep.APIVersion)
		assert.Equal(t, dep.Metadata.Name, obj.Spec.ScaleTarget.Name, "the ScaledObject scales the Deployment")
		require.NotNil(t, obj.Spec.MinReplicas)
		assert.Zero(t, *obj.Spec.MinReplicas, "minReplicaCount")
		env := dep.Spec.Template.env(t)
		assert.NotContains(t, env, "PAYMENTS_STOP_WHEN_IDLE", "a Deployment's pod that exits is restarted")
		assert.Equal(t, example_payment.QueueRequested, env["PAYMENTS_QUEUE"])
	})
	// Every variable the pods set is one payments serve reads (docs_env_test.go checks the
	// table against the code).
	table := string(read(t, "docs/getting-started.md"))
	for _, tpl := range []podTemplate{job["ScaledJob"].Spec.JobTarget.Template, object["Deployment"].Spec.Template} {
		for _, c := range tpl.Spec.Containers {
			for _, e := range c.Env {
				assert.True(t, strings.Contains(table, "`"+e.Name+"`"), "docs/getting-started.md documents %s", e.Name)
			}
		}
	}
}
