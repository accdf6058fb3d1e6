package cudart

import "strconv"

// Code is a cudaError_t value returned by a CUDA runtime call. Every code
// the CUDA headers define, from 11.x to 13.x, has a constant here named
// after the C enumerator without its cudaError prefix, and [Code.String]
// returns the C name (the same text cudaGetErrorName gives), so codes
// print and compare without the library.
type Code int32

// The cudaError_t codes. Comments are given for the codes this package
// acts on; the others mean what the CUDA documentation of the C name says.
const (
	Success                        Code = 0     // cudaSuccess: the call succeeded
	InvalidValue                   Code = 1     // cudaErrorInvalidValue: an argument is out of range
	MemoryAllocation               Code = 2     // cudaErrorMemoryAllocation: the runtime could not allocate enough memory
	InitializationError            Code = 3     // cudaErrorInitializationError: the runtime or driver could not be initialized
	CudartUnloading                Code = 4     // cudaErrorCudartUnloading: the runtime is being unloaded (the process is exiting)
	ProfilerDisabled               Code = 5     // cudaErrorProfilerDisabled
	ProfilerNotInitialized         Code = 6     // cudaErrorProfilerNotInitialized
	ProfilerAlreadyStarted         Code = 7     // cudaErrorProfilerAlreadyStarted
	ProfilerAlreadyStopped         Code = 8     // cudaErrorProfilerAlreadyStopped
	InvalidConfiguration           Code = 9     // cudaErrorInvalidConfiguration
	VersionTranslation             Code = 10    // cudaErrorVersionTranslation
	InvalidPitchValue              Code = 12    // cudaErrorInvalidPitchValue
	InvalidSymbol                  Code = 13    // cudaErrorInvalidSymbol
	InvalidHostPointer             Code = 16    // cudaErrorInvalidHostPointer
	InvalidDevicePointer           Code = 17    // cudaErrorInvalidDevicePointer
	InvalidTexture                 Code = 18    // cudaErrorInvalidTexture
	InvalidTextureBinding          Code = 19    // cudaErrorInvalidTextureBinding
	InvalidChannelDescriptor       Code = 20    // cudaErrorInvalidChannelDescriptor
	InvalidMemcpyDirection         Code = 21    // cudaErrorInvalidMemcpyDirection
	AddressOfConstant              Code = 22    // cudaErrorAddressOfConstant
	TextureFetchFailed             Code = 23    // cudaErrorTextureFetchFailed
	TextureNotBound                Code = 24    // cudaErrorTextureNotBound
	SynchronizationError           Code = 25    // cudaErrorSynchronizationError
	InvalidFilterSetting           Code = 26    // cudaErrorInvalidFilterSetting
	InvalidNormSetting             Code = 27    // cudaErrorInvalidNormSetting
	MixedDeviceExecution           Code = 28    // cudaErrorMixedDeviceExecution
	NotYetImplemented              Code = 31    // cudaErrorNotYetImplemented
	MemoryValueTooLarge            Code = 32    // cudaErrorMemoryValueTooLarge
	StubLibrary                    Code = 34    // cudaErrorStubLibrary: the driver library found is a stub: no real driver is installed
	InsufficientDriver             Code = 35    // cudaErrorInsufficientDriver: no driver is installed, or it is older than the runtime
	CallRequiresNewerDriver        Code = 36    // cudaErrorCallRequiresNewerDriver: the call needs a newer driver than the one installed
	InvalidSurface                 Code = 37    // cudaErrorInvalidSurface
	DuplicateVariableName          Code = 43    // cudaErrorDuplicateVariableName
	DuplicateTextureName           Code = 44    // cudaErrorDuplicateTextureName
	DuplicateSurfaceName           Code = 45    // cudaErrorDuplicateSurfaceName
	DevicesUnavailable             Code = 46    // cudaErrorDevicesUnavailable: every device is busy or unavailable (for example in exclusive mode)
	IncompatibleDriverContext      Code = 49    // cudaErrorIncompatibleDriverContext
	MissingConfiguration           Code = 52    // cudaErrorMissingConfiguration
	PriorLaunchFailure             Code = 53    // cudaErrorPriorLaunchFailure
	LaunchMaxDepthExceeded         Code = 65    // cudaErrorLaunchMaxDepthExceeded
	LaunchFileScopedTex            Code = 66    // cudaErrorLaunchFileScopedTex
	LaunchFileScopedSurf           Code = 67    // cudaErrorLaunchFileScopedSurf
	SyncDepthExceeded              Code = 68    // cudaErrorSyncDepthExceeded
	LaunchPendingCountExceeded     Code = 69    // cudaErrorLaunchPendingCountExceeded
	InvalidDeviceFunction          Code = 98    // cudaErrorInvalidDeviceFunction
	NoDevice                       Code = 100   // cudaErrorNoDevice: no CUDA-capable device was detected
	InvalidDevice                  Code = 101   // cudaErrorInvalidDevice: the device ordinal is not a valid device
	DeviceNotLicensed              Code = 102   // cudaErrorDeviceNotLicensed
	SoftwareValidityNotEstablished Code = 103   // cudaErrorSoftwareValidityNotEstablished
	StartupFailure                 Code = 127   // cudaErrorStartupFailure
	InvalidKernelImage             Code = 200   // cudaErrorInvalidKernelImage
	DeviceUninitialized            Code = 201   // cudaErrorDeviceUninitialized
	MapBufferObjectFailed          Code = 205   // cudaErrorMapBufferObjectFailed
	UnmapBufferObjectFailed        Code = 206   // cudaErrorUnmapBufferObjectFailed
	ArrayIsMapped                  Code = 207   // cudaErrorArrayIsMapped
	AlreadyMapped                  Code = 208   // cudaErrorAlreadyMapped
	NoKernelImageForDevice         Code = 209   // cudaErrorNoKernelImageForDevice
	AlreadyAcquired                Code = 210   // cudaErrorAlreadyAcquired
	NotMapped                      Code = 211   // cudaErrorNotMapped
	NotMappedAsArray               Code = 212   // cudaErrorNotMappedAsArray
	NotMappedAsPointer             Code = 213   // cudaErrorNotMappedAsPointer
	ECCUncorrectable               Code = 214   // cudaErrorECCUncorrectable
	UnsupportedLimit               Code = 215   // cudaErrorUnsupportedLimit
	DeviceAlreadyInUse             Code = 216   // cudaErrorDeviceAlreadyInUse
	PeerAccessUnsupported          Code = 217   // cudaErrorPeerAccessUnsupported
	InvalidPtx                     Code = 218   // cudaErrorInvalidPtx
	InvalidGraphicsContext         Code = 219   // cudaErrorInvalidGraphicsContext
	NvlinkUncorrectable            Code = 220   // cudaErrorNvlinkUncorrectable
	JitCompilerNotFound            Code = 221   // cudaErrorJitCompilerNotFound
	UnsupportedPtxVersion          Code = 222   // cudaErrorUnsupportedPtxVersion
	JitCompilationDisabled         Code = 223   // cudaErrorJitCompilationDisabled
	UnsupportedExecAffinity        Code = 224   // cudaErrorUnsupportedExecAffinity
	UnsupportedDevSideSync         Code = 225   // cudaErrorUnsupportedDevSideSync
	Contained                      Code = 226   // cudaErrorContained
	InvalidSource                  Code = 300   // cudaErrorInvalidSource
	FileNotFound                   Code = 301   // cudaErrorFileNotFound
	SharedObjectSymbolNotFound     Code = 302   // cudaErrorSharedObjectSymbolNotFound
	SharedObjectInitFailed         Code = 303   // cudaErrorSharedObjectInitFailed
	OperatingSystem                Code = 304   // cudaErrorOperatingSystem
	InvalidResourceHandle          Code = 400   // cudaErrorInvalidResourceHandle: a stream or event handle is not valid
	IllegalState                   Code = 401   // cudaErrorIllegalState
	LossyQuery                     Code = 402   // cudaErrorLossyQuery
	SymbolNotFound                 Code = 500   // cudaErrorSymbolNotFound
	NotReady                       Code = 600   // cudaErrorNotReady: asynchronous work has not completed yet (not a failure)
	IllegalAddress                 Code = 700   // cudaErrorIllegalAddress: a device access touched an address that is not valid
	LaunchOutOfResources           Code = 701   // cudaErrorLaunchOutOfResources
	LaunchTimeout                  Code = 702   // cudaErrorLaunchTimeout
	LaunchIncompatibleTexturing    Code = 703   // cudaErrorLaunchIncompatibleTexturing
	PeerAccessAlreadyEnabled       Code = 704   // cudaErrorPeerAccessAlreadyEnabled
	PeerAccessNotEnabled           Code = 705   // cudaErrorPeerAccessNotEnabled
	SetOnActiveProcess             Code = 708   // cudaErrorSetOnActiveProcess
	ContextIsDestroyed             Code = 709   // cudaErrorContextIsDestroyed
	Assert                         Code = 710   // cudaErrorAssert
	TooManyPeers                   Code = 711   // cudaErrorTooManyPeers
	HostMemoryAlreadyRegistered    Code = 712   // cudaErrorHostMemoryAlreadyRegistered: the host range is already registered
	HostMemoryNotRegistered        Code = 713   // cudaErrorHostMemoryNotRegistered: the host pointer was not registered
	HardwareStackError             Code = 714   // cudaErrorHardwareStackError
	IllegalInstruction             Code = 715   // cudaErrorIllegalInstruction
	MisalignedAddress              Code = 716   // cudaErrorMisalignedAddress
	InvalidAddressSpace            Code = 717   // cudaErrorInvalidAddressSpace
	InvalidPc                      Code = 718   // cudaErrorInvalidPc
	LaunchFailure                  Code = 719   // cudaErrorLaunchFailure
	CooperativeLaunchTooLarge      Code = 720   // cudaErrorCooperativeLaunchTooLarge
	TensorMemoryLeak               Code = 721   // cudaErrorTensorMemoryLeak
	NotPermitted                   Code = 800   // cudaErrorNotPermitted: the operation is not permitted
	NotSupported                   Code = 801   // cudaErrorNotSupported: the operation is not supported on this system or device
	SystemNotReady                 Code = 802   // cudaErrorSystemNotReady
	SystemDriverMismatch           Code = 803   // cudaErrorSystemDriverMismatch: the driver does not match the kernel module
	CompatNotSupportedOnDevice     Code = 804   // cudaErrorCompatNotSupportedOnDevice
	MpsConnectionFailed            Code = 805   // cudaErrorMpsConnectionFailed
	MpsRpcFailure                  Code = 806   // cudaErrorMpsRpcFailure
	MpsServerNotReady              Code = 807   // cudaErrorMpsServerNotReady
	MpsMaxClientsReached           Code = 808   // cudaErrorMpsMaxClientsReached
	MpsMaxConnectionsReached       Code = 809   // cudaErrorMpsMaxConnectionsReached
	MpsClientTerminated            Code = 810   // cudaErrorMpsClientTerminated
	CdpNotSupported                Code = 811   // cudaErrorCdpNotSupported
	CdpVersionMismatch             Code = 812   // cudaErrorCdpVersionMismatch
	StreamCaptureUnsupported       Code = 900   // cudaErrorStreamCaptureUnsupported
	StreamCaptureInvalidated       Code = 901   // cudaErrorStreamCaptureInvalidated
	StreamCaptureMerge             Code = 902   // cudaErrorStreamCaptureMerge
	StreamCaptureUnmatched         Code = 903   // cudaErrorStreamCaptureUnmatched
	StreamCaptureUnjoined          Code = 904   // cudaErrorStreamCaptureUnjoined
	StreamCaptureIsolation         Code = 905   // cudaErrorStreamCaptureIsolation
	StreamCaptureImplicit          Code = 906   // cudaErrorStreamCaptureImplicit
	CapturedEvent                  Code = 907   // cudaErrorCapturedEvent
	StreamCaptureWrongThread       Code = 908   // cudaErrorStreamCaptureWrongThread
	Timeout                        Code = 909   // cudaErrorTimeout
	GraphExecUpdateFailure         Code = 910   // cudaErrorGraphExecUpdateFailure
	ExternalDevice                 Code = 911   // cudaErrorExternalDevice
	InvalidClusterSize             Code = 912   // cudaErrorInvalidClusterSize
	FunctionNotLoaded              Code = 913   // cudaErrorFunctionNotLoaded
	InvalidResourceType            Code = 914   // cudaErrorInvalidResourceType
	InvalidResourceConfiguration   Code = 915   // cudaErrorInvalidResourceConfiguration
	StreamDetached                 Code = 917   // cudaErrorStreamDetached
	GraphRecaptureFailure          Code = 918   // cudaErrorGraphRecaptureFailure
	Unknown                        Code = 999   // cudaErrorUnknown: an unknown internal error
	ApiFailureBase                 Code = 10000 // cudaErrorApiFailureBase
)

// Codes returns every code that has a name, in increasing order.
func Codes() []Code {
	return []Code{
		Success, InvalidValue, MemoryAllocation, InitializationError, CudartUnloading, ProfilerDisabled,
		ProfilerNotInitialized, ProfilerAlreadyStarted, ProfilerAlreadyStopped, InvalidConfiguration,
		VersionTranslation, InvalidPitchValue, InvalidSymbol, InvalidHostPointer, InvalidDevicePointer,
		InvalidTexture, InvalidTextureBinding, InvalidChannelDescriptor, InvalidMemcpyDirection,
		AddressOfConstant, TextureFetchFailed, TextureNotBound, SynchronizationError,
		InvalidFilterSetting, InvalidNormSetting, MixedDeviceExecution, NotYetImplemented,
		MemoryValueTooLarge, StubLibrary, InsufficientDriver, CallRequiresNewerDriver, InvalidSurface,
		DuplicateVariableName, DuplicateTextureName, DuplicateSurfaceName, DevicesUnavailable,
		IncompatibleDriverContext, MissingConfiguration, PriorLaunchFailure, LaunchMaxDepthExceeded,
		LaunchFileScopedTex, LaunchFileScopedSurf, SyncDepthExceeded, LaunchPendingCountExceeded,
		InvalidDeviceFunction, NoDevice, InvalidDevice, DeviceNotLicensed,
		SoftwareValidityNotEstablished, StartupFailure, InvalidKernelImage, DeviceUninitialized,
		MapBufferObjectFailed, UnmapBufferObjectFailed, ArrayIsMapped, AlreadyMapped,
		NoKernelImageForDevice, AlreadyAcquired, NotMapped, NotMappedAsArray, NotMappedAsPointer,
		ECCUncorrectable, UnsupportedLimit, DeviceAlreadyInUse, PeerAccessUnsupported, InvalidPtx,
		InvalidGraphicsContext, NvlinkUncorrectable, JitCompilerNotFound, UnsupportedPtxVersion,
		JitCompilationDisabled, UnsupportedExecAffinity, UnsupportedDevSideSync, Contained,
		InvalidSource, FileNotFound, SharedObjectSymbolNotFound, SharedObjectInitFailed, OperatingSystem,
		InvalidResourceHandle, IllegalState, LossyQuery, SymbolNotFound, NotReady, IllegalAddress,
		LaunchOutOfResources, LaunchTimeout, LaunchIncompatibleTexturing, PeerAccessAlreadyEnabled,
		PeerAccessNotEnabled, SetOnActiveProcess, ContextIsDestroyed, Assert, TooManyPeers,
		HostMemoryAlreadyRegistered, HostMemoryNotRegistered, HardwareStackError, IllegalInstruction,
		MisalignedAddress, InvalidAddressSpace, InvalidPc, LaunchFailure, CooperativeLaunchTooLarge,
		TensorMemoryLeak, NotPermitted, NotSupported, SystemNotReady, SystemDriverMismatch,
		CompatNotSupportedOnDevice, MpsConnectionFailed, MpsRpcFailure, MpsServerNotReady,
		MpsMaxClientsReached, MpsMaxConnectionsReached, MpsClientTerminated, CdpNotSupported,
		CdpVersionMismatch, StreamCaptureUnsupported, StreamCaptureInvalidated, StreamCaptureMerge,
		StreamCaptureUnmatched, StreamCaptureUnjoined, StreamCaptureIsolation, StreamCaptureImplicit,
		CapturedEvent, StreamCaptureWrongThread, Timeout, GraphExecUpdateFailure, ExternalDevice,
		InvalidClusterSize, FunctionNotLoaded, InvalidResourceType, InvalidResourceConfiguration,
		StreamDetached, GraphRecaptureFailure, Unknown, ApiFailureBase,
	}
}

// Known reports whether c is one of the named codes.
func (c Code) Known() bool { return c.name() != "" }

// String returns the C name of c, such as "cudaErrorNotReady", or
// "cudaError(N)" for a code without a name.
func (c Code) String() string {
	if n := c.name(); n != "" {
		return n
	}
	return "cudaError(" + strconv.Itoa(int(c)) + ")"
}

func (c Code) name() string {
	switch c {
	case Success:
		return "cudaSuccess"
	case InvalidValue:
		return "cudaErrorInvalidValue"
	case MemoryAllocation:
		return "cudaErrorMemoryAllocation"
	case InitializationError:
		return "cudaErrorInitializationError"
	case CudartUnloading:
		return "cudaErrorCudartUnloading"
	case ProfilerDisabled:
		return "cudaErrorProfilerDisabled"
	case ProfilerNotInitialized:
		return "cudaErrorProfilerNotInitialized"
	case ProfilerAlreadyStarted:
		return "cudaErrorProfilerAlreadyStarted"
	case ProfilerAlreadyStopped:
		return "cudaErrorProfilerAlreadyStopped"
	case InvalidConfiguration:
		return "cudaErrorInvalidConfiguration"
	case VersionTranslation:
		return "cudaErrorVersionTranslation"
	case InvalidPitchValue:
		return "cudaErrorInvalidPitchValue"
	case InvalidSymbol:
		return "cudaErrorInvalidSymbol"
	case InvalidHostPointer:
		return "cudaErrorInvalidHostPointer"
	case InvalidDevicePointer:
		return "cudaErrorInvalidDevicePointer"
	case InvalidTexture:
		return "cudaErrorInvalidTexture"
	case InvalidTextureBinding:
		return "cudaErrorInvalidTextureBinding"
	case InvalidChannelDescriptor:
		return "cudaErrorInvalidChannelDescriptor"
	case InvalidMemcpyDirection:
		return "cudaErrorInvalidMemcpyDirection"
	case AddressOfConstant:
		return "cudaErrorAddressOfConstant"
	case TextureFetchFailed:
		return "cudaErrorTextureFetchFailed"
	case TextureNotBound:
		return "cudaErrorTextureNotBound"
	case SynchronizationError:
		return "cudaErrorSynchronizationError"
	case InvalidFilterSetting:
		return "cudaErrorInvalidFilterSetting"
	case InvalidNormSetting:
		return "cudaErrorInvalidNormSetting"
	case MixedDeviceExecution:
		return "cudaErrorMixedDeviceExecution"
	case NotYetImplemented:
		return "cudaErrorNotYetImplemented"
	case MemoryValueTooLarge:
		return "cudaErrorMemoryValueTooLarge"
	case StubLibrary:
		return "cudaErrorStubLibrary"
	case InsufficientDriver:
		return "cudaErrorInsufficientDriver"
	case CallRequiresNewerDriver:
		return "cudaErrorCallRequiresNewerDriver"
	case InvalidSurface:
		return "cudaErrorInvalidSurface"
	case DuplicateVariableName:
		return "cudaErrorDuplicateVariableName"
	case DuplicateTextureName:
		return "cudaErrorDuplicateTextureName"
	case DuplicateSurfaceName:
		return "cudaErrorDuplicateSurfaceName"
	case DevicesUnavailable:
		return "cudaErrorDevicesUnavailable"
	case IncompatibleDriverContext:
		return "cudaErrorIncompatibleDriverContext"
	case MissingConfiguration:
		return "cudaErrorMissingConfiguration"
	case PriorLaunchFailure:
		return "cudaErrorPriorLaunchFailure"
	case LaunchMaxDepthExceeded:
		return "cudaErrorLaunchMaxDepthExceeded"
	case LaunchFileScopedTex:
		return "cudaErrorLaunchFileScopedTex"
	case LaunchFileScopedSurf:
		return "cudaErrorLaunchFileScopedSurf"
	case SyncDepthExceeded:
		return "cudaErrorSyncDepthExceeded"
	case LaunchPendingCountExceeded:
		return "cudaErrorLaunchPendingCountExceeded"
	case InvalidDeviceFunction:
		return "cudaErrorInvalidDeviceFunction"
	case NoDevice:
		return "cudaErrorNoDevice"
	case InvalidDevice:
		return "cudaErrorInvalidDevice"
	case DeviceNotLicensed:
		return "cudaErrorDeviceNotLicensed"
	case SoftwareValidityNotEstablished:
		return "cudaErrorSoftwareValidityNotEstablished"
	case StartupFailure:
		return "cudaErrorStartupFailure"
	case InvalidKernelImage:
		return "cudaErrorInvalidKernelImage"
	case DeviceUninitialized:
		return "cudaErrorDeviceUninitialized"
	case MapBufferObjectFailed:
		return "cudaErrorMapBufferObjectFailed"
	case UnmapBufferObjectFailed:
		return "cudaErrorUnmapBufferObjectFailed"
	case ArrayIsMapped:
		return "cudaErrorArrayIsMapped"
	case AlreadyMapped:
		return "cudaErrorAlreadyMapped"
	case NoKernelImageForDevice:
		return "cudaErrorNoKernelImageForDevice"
	case AlreadyAcquired:
		return "cudaErrorAlreadyAcquired"
	case NotMapped:
		return "cudaErrorNotMapped"
	case NotMappedAsArray:
		return "cudaErrorNotMappedAsArray"
	case NotMappedAsPointer:
		return "cudaErrorNotMappedAsPointer"
	case ECCUncorrectable:
		return "cudaErrorECCUncorrectable"
	case UnsupportedLimit:
		return "cudaErrorUnsupportedLimit"
	case DeviceAlreadyInUse:
		return "cudaErrorDeviceAlreadyInUse"
	case PeerAccessUnsupported:
		return "cudaErrorPeerAccessUnsupported"
	case InvalidPtx:
		return "cudaErrorInvalidPtx"
	case InvalidGraphicsContext:
		return "cudaErrorInvalidGraphicsContext"
	case NvlinkUncorrectable:
		return "cudaErrorNvlinkUncorrectable"
	case JitCompilerNotFound:
		return "cudaErrorJitCompilerNotFound"
	case UnsupportedPtxVersion:
		return "cudaErrorUnsupportedPtxVersion"
	case JitCompilationDisabled:
		return "cudaErrorJitCompilationDisabled"
	case UnsupportedExecAffinity:
		return "cudaErrorUnsupportedExecAffinity"
	case UnsupportedDevSideSync:
		return "cudaErrorUnsupportedDevSideSync"
	case Contained:
		return "cudaErrorContained"
	case InvalidSource:
		return "cudaErrorInvalidSource"
	case FileNotFound:
		return "cudaErrorFileNotFound"
	case SharedObjectSymbolNotFound:
		return "cudaErrorSharedObjectSymbolNotFound"
	case SharedObjectInitFailed:
		return "cudaErrorSharedObjectInitFailed"
	case OperatingSystem:
		return "cudaErrorOperatingSystem"
	case InvalidResourceHandle:
		return "cudaErrorInvalidResourceHandle"
	case IllegalState:
		return "cudaErrorIllegalState"
	case LossyQuery:
		return "cudaErrorLossyQuery"
	case SymbolNotFound:
		return "cudaErrorSymbolNotFound"
	case NotReady:
		return "cudaErrorNotReady"
	case IllegalAddress:
		return "cudaErrorIllegalAddress"
	case LaunchOutOfResources:
		return "cudaErrorLaunchOutOfResources"
	case LaunchTimeout:
		return "cudaErrorLaunchTimeout"
	case LaunchIncompatibleTexturing:
		return "cudaErrorLaunchIncompatibleTexturing"
	case PeerAccessAlreadyEnabled:
		return "cudaErrorPeerAccessAlreadyEnabled"
	case PeerAccessNotEnabled:
		return "cudaErrorPeerAccessNotEnabled"
	case SetOnActiveProcess:
		return "cudaErrorSetOnActiveProcess"
	case ContextIsDestroyed:
		return "cudaErrorContextIsDestroyed"
	case Assert:
		return "cudaErrorAssert"
	case TooManyPeers:
		return "cudaErrorTooManyPeers"
	case HostMemoryAlreadyRegistered:
		return "cudaErrorHostMemoryAlreadyRegistered"
	case HostMemoryNotRegistered:
		return "cudaErrorHostMemoryNotRegistered"
	case HardwareStackError:
		return "cudaErrorHardwareStackError"
	case IllegalInstruction:
		return "cudaErrorIllegalInstruction"
	case MisalignedAddress:
		return "cudaErrorMisalignedAddress"
	case InvalidAddressSpace:
		return "cudaErrorInvalidAddressSpace"
	case InvalidPc:
		return "cudaErrorInvalidPc"
	case LaunchFailure:
		return "cudaErrorLaunchFailure"
	case CooperativeLaunchTooLarge:
		return "cudaErrorCooperativeLaunchTooLarge"
	case TensorMemoryLeak:
		return "cudaErrorTensorMemoryLeak"
	case NotPermitted:
		return "cudaErrorNotPermitted"
	case NotSupported:
		return "cudaErrorNotSupported"
	case SystemNotReady:
		return "cudaErrorSystemNotReady"
	case SystemDriverMismatch:
		return "cudaErrorSystemDriverMismatch"
	case CompatNotSupportedOnDevice:
		return "cudaErrorCompatNotSupportedOnDevice"
	case MpsConnectionFailed:
		return "cudaErrorMpsConnectionFailed"
	case MpsRpcFailure:
		return "cudaErrorMpsRpcFailure"
	case MpsServerNotReady:
		return "cudaErrorMpsServerNotReady"
	case MpsMaxClientsReached:
		return "cudaErrorMpsMaxClientsReached"
	case MpsMaxConnectionsReached:
		return "cudaErrorMpsMaxConnectionsReached"
	case MpsClientTerminated:
		return "cudaErrorMpsClientTerminated"
	case CdpNotSupported:
		return "cudaErrorCdpNotSupported"
	case CdpVersionMismatch:
		return "cudaErrorCdpVersionMismatch"
	case StreamCaptureUnsupported:
		return "cudaErrorStreamCaptureUnsupported"
	case StreamCaptureInvalidated:
		return "cudaErrorStreamCaptureInvalidated"
	case StreamCaptureMerge:
		return "cudaErrorStreamCaptureMerge"
	case StreamCaptureUnmatched:
		return "cudaErrorStreamCaptureUnmatched"
	case StreamCaptureUnjoined:
		return "cudaErrorStreamCaptureUnjoined"
	case StreamCaptureIsolation:
		return "cudaErrorStreamCaptureIsolation"
	case StreamCaptureImplicit:
		return "cudaErrorStreamCaptureImplicit"
	case CapturedEvent:
		return "cudaErrorCapturedEvent"
	case StreamCaptureWrongThread:
		return "cudaErrorStreamCaptureWrongThread"
	case Timeout:
		return "cudaErrorTimeout"
	case GraphExecUpdateFailure:
		return "cudaErrorGraphExecUpdateFailure"
	case ExternalDevice:
		return "cudaErrorExternalDevice"
	case InvalidClusterSize:
		return "cudaErrorInvalidClusterSize"
	case FunctionNotLoaded:
		return "cudaErrorFunctionNotLoaded"
	case InvalidResourceType:
		return "cudaErrorInvalidResourceType"
	case InvalidResourceConfiguration:
		return "cudaErrorInvalidResourceConfiguration"
	case StreamDetached:
		return "cudaErrorStreamDetached"
	case GraphRecaptureFailure:
		return "cudaErrorGraphRecaptureFailure"
	case Unknown:
		return "cudaErrorUnknown"
	case ApiFailureBase:
		return "cudaErrorApiFailureBase"
	}
	return ""
}
