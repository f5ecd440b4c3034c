// Command kuberay-pods builds the head Pod and the first worker group's Pod for one RayCluster
// by calling KubeRay v1.7.0's own exported pod-building functions, in the order its RayCluster
// controller calls them (rayClusterReconcile -> reconcilePods -> createHeadPod/buildHeadPod and
// createWorkerPodWithIndex/buildWorkerPod), with an operator that has default options: no
// sidecar containers, no default container envs / pod labels / pod annotations, no batch
// scheduler. The feature gate RayClusterHistoryServer is enabled the way KubeRay's main does
// for --feature-gates; every other gate keeps its default.
//
// It prints {"head": <Pod>, "worker": <Pod>} as indented JSON on stdout. raypipe's tests use the
// output as golden fixtures (tests/fixtures/kuberay-pods/). Nothing here re-implements KubeRay:
// the only logic of our own is reading the input and the few unexported glue lines of the
// controller (setDefaults, getCreatorCRDType), noted below.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	configapi "github.com/ray-project/kuberay/ray-operator/apis/config/v1alpha1"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/batchscheduler"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/common"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	"github.com/ray-project/kuberay/ray-operator/pkg/features"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"
)

// Environment variables KubeRay's pod-building code reads (v1.7.0). They are cleared so the
// output is the operator's default behaviour whatever the caller's environment is.
var kubeRayEnv = []string{
	"CLUSTER_DOMAIN",                     // utils.GetClusterDomainName -> "cluster.local"
	"ENABLE_INIT_CONTAINER_INJECTION",    // default: inject wait-gcs-ready into workers
	"ENABLE_PROBES_INJECTION",            // default: inject liveness/readiness probes
	"ENABLE_LOGIN_SHELL",                 // default: /bin/bash -c (not -lc)
	"ENABLE_DETERMINISTIC_HEAD_POD_NAME", // default: head uses generateName
	"ENABLE_RAY_HEAD_CLUSTER_IP_SERVICE", // head service name: not ClusterIP-specific
	"USE_INGRESS_ON_OPENSHIFT",
}

func main() {
	featureGates := flag.String("feature-gates", "RayClusterHistoryServer=true",
		"KubeRay --feature-gates value (same syntax as the operator's flag)")
	createAnnotations := flag.Bool("create-annotations", true,
		"also add the two annotations createHeadPod puts on the head Pod after buildHeadPod "+
			"(ray.io/hash-without-replicas-and-workers-to-delete, ray.io/kuberay-version)")
	batchSchedulerName := flag.String("batch-scheduler", "",
		"KubeRay --batch-scheduler value: run that scheduler plugin on the cluster as the "+
			"RayCluster controller does, and print the PodGroups it creates")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: %s [flags] raycluster.yaml\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}

	for _, name := range kubeRayEnv {
		os.Unsetenv(name)
	}

	// KubeRay logs through ctrl.LoggerFrom(ctx); send it to stderr so stdout stays JSON.
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	ctx := ctrl.LoggerInto(context.Background(), ctrl.Log.WithName("kuberay-pods"))

	// Same call KubeRay's main makes for --feature-gates.
	if err := utilfeature.DefaultMutableFeatureGate.Set(*featureGates); err != nil {
		fail("set feature gates: %v", err)
	}
	if !features.Enabled(features.RayClusterHistoryServer) {
		fmt.Fprintln(os.Stderr, "warning: RayClusterHistoryServer is disabled")
	}

	data, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		fail("read input: %v", err)
	}
	var instance rayv1.RayCluster
	// A RayJob input: its RayCluster is the one the RayJob controller would create, and the
	// job's own batch scheduling (PodGroup, cluster and submitter metadata) is printed too.
	var rayJob *rayv1.RayJob
	var kind struct {
		Kind string `json:"kind"`
	}
	if err := yaml.Unmarshal(data, &kind); err != nil {
		fail("decode kind: %v", err)
	}
	if kind.Kind == "RayJob" {
		rayJob = &rayv1.RayJob{}
		if err := yaml.UnmarshalStrict(data, rayJob); err != nil {
			fail("decode RayJob: %v", err)
		}
		instance = clusterForRayJob(rayJob)
	} else if err := yaml.UnmarshalStrict(data, &instance); err != nil {
		fail("decode RayCluster: %v", err)
	}
	if instance.Namespace == "" {
		instance.Namespace = "default"
	}
	// The API server applies the CRD default numOfHosts=1 (+kubebuilder:default:=1).
	for i := range instance.Spec.WorkerGroupSpecs {
		if instance.Spec.WorkerGroupSpecs[i].NumOfHosts == 0 {
			instance.Spec.WorkerGroupSpecs[i].NumOfHosts = 1
		}
	}
	if len(instance.Spec.WorkerGroupSpecs) == 0 {
		fail("the RayCluster has no workerGroupSpecs")
	}

	// rayClusterReconcile: setDefaults (unexported; two nil-map checks), then validation.
	if instance.Spec.HeadGroupSpec.RayStartParams == nil {
		instance.Spec.HeadGroupSpec.RayStartParams = map[string]string{}
	}
	for i := range instance.Spec.WorkerGroupSpecs {
		if instance.Spec.WorkerGroupSpecs[i].RayStartParams == nil {
			instance.Spec.WorkerGroupSpecs[i].RayStartParams = map[string]string{}
		}
	}
	if err := utils.ValidateRayClusterMetadata(instance.ObjectMeta); err != nil {
		fail("KubeRay rejects the metadata: %v", err)
	}
	if err := utils.ValidateRayClusterSpec(&instance.Spec, instance.Annotations); err != nil {
		fail("KubeRay rejects the spec: %v", err)
	}

	scheme := runtime.NewScheme()
	if err := rayv1.AddToScheme(scheme); err != nil {
		fail("scheme: %v", err)
	}

	// With a batch scheduler, the controller's reconcilePods first calls
	// DoBatchSchedulingOnSubmission; the plugin writes its PodGroup through the manager's
	// client (here a fake one). The cluster as read from the API server carries its TypeMeta
	// (controller-runtime's cache sets it), which scheduler-plugins copies into its owner
	// reference.
	var scheduler batchSchedulerPlugin
	var fakeClient clientReader
	var jobOutput map[string]interface{}
	if *batchSchedulerName != "" {
		instance.APIVersion = rayv1.GroupVersion.String()
		instance.Kind = "RayCluster"
		clientScheme := runtime.NewScheme()
		if err := rayv1.AddToScheme(clientScheme); err != nil {
			fail("scheme: %v", err)
		}
		cli := fake.NewClientBuilder().WithScheme(clientScheme).Build()
		config := configapi.Configuration{BatchScheduler: *batchSchedulerName}
		if err := configapi.ValidateBatchSchedulerConfig(ctrl.Log, config); err != nil {
			fail("KubeRay rejects the batch scheduler: %v", err)
		}
		manager, err := batchscheduler.NewSchedulerManager(ctx, config, nil, cli)
		if err != nil {
			fail("scheduler manager: %v", err)
		}
		plugin, err := manager.GetScheduler()
		if err != nil {
			fail("scheduler: %v", err)
		}
		if rayJob != nil {
			jobOutput = scheduleRayJob(ctx, plugin, rayJob, &instance)
		}
		if err := plugin.DoBatchSchedulingOnSubmission(ctx, &instance); err != nil {
			fail("DoBatchSchedulingOnSubmission: %v", err)
		}
		scheduler, fakeClient = plugin, cli
	}

	// reconcilePods computes the hash before creating anything.
	clusterHash, err := utils.GenerateHashWithoutReplicasAndWorkersToDelete(instance.Spec)
	if err != nil {
		fail("hash: %v", err)
	}

	// createHeadPod(ctx, *instance, clusterHash): the instance is passed by value, so maps in
	// its spec (rayStartParams) are shared with the reconciler's copy, as in KubeRay.
	head := buildHeadPod(ctx, instance, scheme)
	if *createAnnotations && clusterHash != "" {
		head.Annotations[utils.UpgradeStrategyRecreateHashKey] = clusterHash
		head.Annotations[utils.KubeRayVersion] = utils.KUBERAY_VERSION
	}

	// reconcilePods: the first worker of a group is created by
	// createWorkerPodWithIndex(ctx, *instance, *worker.DeepCopy(), "", 0, 0) when
	// RayMultiHostIndexing is on (the default), or by createWorkerPod, which calls
	// buildWorkerPod with the same ("", 0, 0). reconcilePods also clamps numOfHosts to >= 1.
	worker := instance.Spec.WorkerGroupSpecs[0]
	if worker.NumOfHosts <= 0 {
		worker.NumOfHosts = 1
	}
	workerPod := buildWorkerPod(ctx, instance, *worker.DeepCopy(), "", 0, 0, scheme)

	output := map[string]interface{}{"head": head, "worker": workerPod}
	if scheduler != nil {
		// createHeadPod / createWorkerPodWithIndex hand each built Pod to the plugin.
		scheduler.AddMetadataToChildResource(ctx, &instance, &head, utils.RayNodeHeadGroupLabelValue)
		scheduler.AddMetadataToChildResource(ctx, &instance, &workerPod, worker.GroupName)
		output["head"], output["worker"] = head, workerPod
		output["podGroups"] = listPodGroups(ctx, fakeClient)
		for key, value := range jobOutput {
			output[key] = value
		}
	}
	out, err := json.MarshalIndent(output, "", "  ")
	if err != nil {
		fail("encode: %v", err)
	}
	os.Stdout.Write(append(out, '\n'))
}

// buildHeadPod mirrors RayClusterReconciler.buildHeadPod with empty operator options (the
// sidecar / default-annotation / default-label branches are all `len(...) > 0` and skipped).
func buildHeadPod(ctx context.Context, instance rayv1.RayCluster, scheme *runtime.Scheme) corev1.Pod {
	podName := utils.PodName(instance.Name, rayv1.HeadNode, !utils.IsDeterministicHeadPodNameEnabled())
	fqdnRayIP := utils.GenerateFQDNServiceName(ctx, instance, instance.Namespace)
	headPort := common.GetHeadPort(instance.Spec.HeadGroupSpec.RayStartParams)
	autoscalingEnabled := utils.IsAutoscalingEnabled(&instance.Spec)
	podConf := common.DefaultHeadPodTemplate(ctx, instance, instance.Spec.HeadGroupSpec, podName, headPort)
	creatorCRDType := creatorCRDType(instance)
	pod := common.BuildPod(ctx, podConf, rayv1.HeadNode, instance.Spec.HeadGroupSpec.RayStartParams, headPort, autoscalingEnabled, creatorCRDType, fqdnRayIP, nil, instance.Spec.RayVersion)
	if err := controllerutil.SetControllerReference(&instance, &pod, scheme); err != nil {
		fail("set controller reference: %v", err)
	}
	return pod
}

// buildWorkerPod mirrors RayClusterReconciler.buildWorkerPod with empty operator options.
func buildWorkerPod(ctx context.Context, instance rayv1.RayCluster, worker rayv1.WorkerGroupSpec, replicaGrpName string, replicaIndex int, hostIndex int, scheme *runtime.Scheme) corev1.Pod {
	podName := utils.PodName(fmt.Sprintf("%s-%s", instance.Name, worker.GroupName), rayv1.WorkerNode, true)
	fqdnRayIP := utils.GenerateFQDNServiceName(ctx, instance, instance.Namespace)
	headPort := common.GetHeadPort(instance.Spec.HeadGroupSpec.RayStartParams)
	autoscalingEnabled := utils.IsAutoscalingEnabled(&instance.Spec)
	podTemplateSpec := common.DefaultWorkerPodTemplate(ctx, instance, worker, podName, fqdnRayIP, headPort, replicaGrpName, replicaIndex, hostIndex)
	creatorCRDType := creatorCRDType(instance)
	pod := common.BuildPod(ctx, podTemplateSpec, rayv1.WorkerNode, worker.RayStartParams, headPort, autoscalingEnabled, creatorCRDType, fqdnRayIP, nil, instance.Spec.RayVersion)
	if err := controllerutil.SetControllerReference(&instance, &pod, scheme); err != nil {
		fail("set controller reference: %v", err)
	}
	return pod
}

// creatorCRDType is the controller's unexported getCreatorCRDType: one exported call.
func creatorCRDType(instance rayv1.RayCluster) utils.CRDType {
	return utils.GetCRDType(instance.Labels[utils.RayOriginatedFromCRDLabelKey])
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "kuberay-pods: "+format+"\n", args...)
	os.Exit(1)
}

type batchSchedulerPlugin interface {
	DoBatchSchedulingOnSubmission(ctx context.Context, object metav1.Object) error
	AddMetadataToChildResource(ctx context.Context, parent metav1.Object, child metav1.Object, groupName string)
}

type clientReader interface {
	List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error
}

// podGroupKinds are the PodGroup kinds KubeRay's plugins create (Volcano, scheduler-plugins).
var podGroupKinds = []schema.GroupVersionKind{
	{Group: "scheduling.volcano.sh", Version: "v1beta1", Kind: "PodGroupList"},
	{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Kind: "PodGroupList"},
}

// listPodGroups returns every PodGroup the plugin wrote to the fake client, as JSON objects.
func listPodGroups(ctx context.Context, cli clientReader) []map[string]interface{} {
	groups := []map[string]interface{}{}
	for _, gvk := range podGroupKinds {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk)
		if err := cli.List(ctx, list); err != nil {
			// The kind is not in this plugin's scheme: it made none.
			continue
		}
		for _, item := range list.Items {
			groups = append(groups, item.Object)
		}
	}
	return groups
}

// clusterFromRayJobName is the fixed name given to a RayJob's cluster (KubeRay adds a random
// suffix to the RayJob's name).
const clusterFromRayJobSuffix = "-abcde"

// clusterForRayJob is the RayJob controller's unexported constructRayClusterForRayJob, less
// the owner reference and SidecarMode's submitter container: the job's labels and annotations
// plus the origin and submission-mode labels, on a copy of rayClusterSpec. The API server's
// default submissionMode (K8sJobMode) is applied first.
func clusterForRayJob(rayJob *rayv1.RayJob) rayv1.RayCluster {
	if rayJob.Namespace == "" {
		rayJob.Namespace = "default"
	}
	if rayJob.Spec.SubmissionMode == "" {
		rayJob.Spec.SubmissionMode = rayv1.K8sJobMode
	}
	if rayJob.Spec.RayClusterSpec == nil {
		fail("the RayJob has no rayClusterSpec")
	}
	// The RayJob CRD embeds RayCluster's schema: the API server defaults numOfHosts there too.
	for i := range rayJob.Spec.RayClusterSpec.WorkerGroupSpecs {
		if rayJob.Spec.RayClusterSpec.WorkerGroupSpecs[i].NumOfHosts == 0 {
			rayJob.Spec.RayClusterSpec.WorkerGroupSpecs[i].NumOfHosts = 1
		}
	}
	rayJob.APIVersion = rayv1.GroupVersion.String()
	rayJob.Kind = "RayJob"
	labels := map[string]string{}
	for k, v := range rayJob.Labels {
		labels[k] = v
	}
	labels[utils.RayOriginatedFromCRNameLabelKey] = rayJob.Name
	labels[utils.RayOriginatedFromCRDLabelKey] = utils.RayOriginatedFromCRDLabelValue(utils.RayJobCRD)
	labels[utils.RayJobSubmissionModeLabelKey] = string(rayJob.Spec.SubmissionMode)
	annotations := map[string]string{}
	for k, v := range rayJob.Annotations {
		annotations[k] = v
	}
	if rayJob.Spec.SubmissionMode == rayv1.SidecarMode {
		annotations[utils.DisableProvisionedHeadRestartAnnotationKey] = "true"
	}
	cluster := rayv1.RayCluster{Spec: *rayJob.Spec.RayClusterSpec.DeepCopy()}
	cluster.Name = rayJob.Name + clusterFromRayJobSuffix
	cluster.Namespace = rayJob.Namespace
	cluster.Labels = labels
	cluster.Annotations = annotations
	return cluster
}

// scheduleRayJob makes the RayJob controller's batch scheduler calls, in its order: the
// job's DoBatchSchedulingOnSubmission (Initializing), AddMetadataToChildResource on the
// RayCluster it creates (K8sJobMode only, group ""), and on the submitter Pod template
// (common.GetSubmitterTemplate, group "submittergroup", K8sJobMode). It returns the cluster's
// metadata and the template as the plugin left them, and the plugin's error if it refused.
func scheduleRayJob(ctx context.Context, plugin batchSchedulerPlugin, rayJob *rayv1.RayJob, cluster *rayv1.RayCluster) map[string]interface{} {
	out := map[string]interface{}{}
	if err := plugin.DoBatchSchedulingOnSubmission(ctx, rayJob); err != nil {
		out["rayJobError"] = err.Error()
		return out
	}
	if rayJob.Spec.SubmissionMode == rayv1.K8sJobMode {
		plugin.AddMetadataToChildResource(ctx, rayJob, cluster, "")
		template := common.GetSubmitterTemplate(&rayJob.Spec, rayJob.Spec.RayClusterSpec)
		plugin.AddMetadataToChildResource(ctx, rayJob, &template, utils.RayNodeSubmitterGroupLabelValue)
		out["submitterTemplate"] = template
	}
	out["rayClusterMetadata"] = map[string]interface{}{
		"name":        cluster.Name,
		"labels":      cluster.Labels,
		"annotations": cluster.Annotations,
	}
	return out
}
